package registry

import (
	"errors"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

// TestHandle_RegisterFrom_Registration: an allocation of the registration
// directory records its source, keeps it across a restart, is not taken
// over from another source, and re-registering it is a no-op.
func TestHandle_RegisterFrom_Registration(t *testing.T) {
	defer leakcheck.Check(t)()
	p, q := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
	defer p.Stop()
	defer q.Stop()
	e := newEnv(t, nil)
	defer e.close()
	spec := attachedSpec("drv.example", "drv.example", plugin.Node, p)
	a, err := e.h.RegisterFrom(ctx(t), spec, SourceRegistration)
	if err != nil || a.Source != SourceRegistration {
		t.Fatalf("RegisterFrom = %+v, %v; want source registration", a, err)
	}
	if again, err := e.h.RegisterFrom(ctx(t), spec, SourceRegistration); err != nil || again.Seq != a.Seq {
		t.Errorf("again = %+v, %v; want the same allocation", again, err)
	}
	// The API registering the same definition changes nothing, not even
	// its source.
	if same, err := e.h.Register(ctx(t), spec); err != nil || same.Source != SourceRegistration {
		t.Errorf("API register of the same spec = %+v, %v", same, err)
	}
	e.waitHealthy("drv.example")
	e.restart()
	m := e.waitHealthy("drv.example")
	if m["drv.example"].Source != SourceRegistration || m["drv.example"].Seq != a.Seq {
		t.Errorf("after a restart = %+v", m["drv.example"])
	}

	// An API allocation is not the directory's to take over.
	e.register(attachedSpec("manual", "other", plugin.Node, q))
	_, err = e.h.RegisterFrom(ctx(t), attachedSpec("manual", "other", plugin.Node, q), SourceRegistration)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), `allocation "manual" was registered from the API; deregister it first`) {
		t.Errorf("RegisterFrom over an API allocation: %v", err)
	}
	if _, err := e.h.RegisterFrom(ctx(t), spec, SourceConfig); err == nil {
		t.Error("RegisterFrom with the config source: no error")
	}
}
