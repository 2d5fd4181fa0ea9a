package actorkit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

type echo struct{ s string }

type silent struct{}

func TestRequest(t *testing.T) {
	defer leakcheck.Check(t)()
	log := logrus.NewEntry(logrus.New())
	log.Logger.SetLevel(logrus.PanicLevel)
	sys := NewSystem(log)
	defer sys.Shutdown()
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(*echo); ok {
			ctx.Respond(m)
		}
	}))
	defer func() { _ = sys.Root.StopFuture(pid).Wait() }()

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name    string
		ctx     context.Context
		pid     *actor.PID
		msg     any
		timeout time.Duration
		want    string
		wantErr error
	}{
		{"reply", context.Background(), pid, &echo{"hi"}, time.Minute, "hi", nil},
		{"no reply times out", context.Background(), pid, &silent{}, 10 * time.Millisecond, "", ErrTimeout},
		{"cancelled context", cancelled, pid, &silent{}, time.Minute, "", context.Canceled},
		{"dead actor", context.Background(), sys.NewLocalPID("nobody"), &echo{"x"}, time.Minute, "", ErrNoActor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Request(tt.ctx, sys, tt.pid, tt.msg, tt.timeout)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e, ok := r.(*echo); !ok || e.s != tt.want {
				t.Fatalf("reply = %#v, want echo %q", r, tt.want)
			}
		})
	}
}
