package registry

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

// panickyStore panics in PutAllocation while armed: a bug in the registry's
// path, as far as supervision is concerned.
type panickyStore struct {
	Store
	armed atomic.Bool
}

func (s *panickyStore) PutAllocation(ctx context.Context, a persistence.Allocation) (persistence.Allocation, error) {
	if s.armed.CompareAndSwap(true, false) {
		panic("store exploded")
	}
	return s.Store.PutAllocation(ctx, a)
}

// A panic in the registry restarts it: its allocation actors are stopped
// and the new registry restores them from the store.
func TestHandle_RegistryPanicRestoresFromStore(t *testing.T) {
	defer leakcheck.Check(t)()
	f1, f2 := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
	defer f1.Stop()
	defer f2.Stop()
	var ps *panickyStore
	e := newEnv(t, func(c *Config) {
		ps = &panickyStore{Store: c.Store}
		c.Store = ps
	})
	defer e.close()
	e.register(attachedSpec("a1", "p", plugin.Node, f1))
	before := e.waitHealthy("a1")

	ps.armed.Store(true)
	rctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := e.h.Register(rctx, attachedSpec("a2", "p", plugin.Node, f2)); err == nil {
		t.Fatal("the registration that made the registry panic succeeded")
	}
	m := e.waitUntil("a1 restored and healthy", func(m map[string]AllocationInfo) bool {
		return m["a1"].Healthy && m["a1"].HealthSince.After(before["a1"].HealthSince)
	})
	if _, ok := m["a2"]; ok {
		t.Error("a2 is registered although its registration failed before it was stored")
	}
	if m["a1"].Seq != before["a1"].Seq || !m["a1"].Singleton {
		t.Errorf("a1 after restore = %+v", m["a1"])
	}
	if got := e.restartsOf("registry"); got != 1 {
		t.Errorf("csiactor_actor_restarts_total{kind=registry} = %v, want 1", got)
	}
	// The restarted registry works.
	e.register(attachedSpec("a2", "p", plugin.Node, f2))
	e.waitHealthy("a2")
	if got := e.active("p", plugin.Node); got != "a2" {
		t.Errorf("active = %s, want a2", got)
	}
}
