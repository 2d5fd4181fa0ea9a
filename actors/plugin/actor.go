package plugin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/csi"
)

// StaleProcess identifies a process of an exec-managed allocation that a
// previous run of the agent started, as persisted with the allocation.
// The State file in the allocation's directory, which names the log shim
// too, takes precedence; StaleProcess is for records of agents that wrote
// none.
type StaleProcess struct {
	PID      int
	PIDStart uint64
}

// Props returns the props of the allocation actor for spec, which must be
// valid and have its Socket set (see Spec.WithSocket; a bare command name
// is not looked up again here: the start fails and is retried if it is
// not found). An exec-managed actor first looks for the process a
// previous agent left running (the State file in the socket's directory,
// else stale) and adopts it when it still runs and answers on its socket;
// otherwise what is left of it is killed before the plugin is started, so
// two copies never run. opts are added to the props (middleware, for
// example).
func Props(cfg Config, spec Spec, stale StaleProcess, opts ...actor.PropsOption) (*actor.Props, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if spec.ContainerManaged() && cfg.Containers == nil {
		return nil, fmt.Errorf("%w: container launcher is required for image allocation %q", ErrInvalidConfig, spec.ID)
	}
	if spec.ExecManaged() && cfg.Launcher == nil {
		return nil, fmt.Errorf("%w: launcher is required for exec-managed allocation %q", ErrInvalidConfig, spec.ID)
	}
	if spec.Socket == "" {
		return nil, fmt.Errorf("%w: socket is not set (use WithSocket)", ErrInvalidSpec)
	}
	return actor.PropsFromProducer(func() actor.Actor {
		return &Actor{
			cfg:   cfg,
			spec:  spec,
			stale: stale,
			log:   cfg.Log.WithFields(logrus.Fields{"alloc": spec.ID, "plugin": spec.Plugin}),
		}
	}, opts...), nil
}

// Actor is the allocation actor. Its fields belong to its goroutine (the
// one protoactor runs Receive on), except where noted.
type Actor struct {
	cfg   Config
	spec  Spec
	stale StaleProcess
	log   *logrus.Entry

	// Set in Started, constant until the incarnation ends; read by the
	// actor's goroutines.
	system *actor.ActorSystem
	self   *actor.PID
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine this incarnation started
	heart  *timer
	rerun  *timer // restarts the process after a backoff

	status   Status
	reported Status
	done     bool // torn down
	sentLast bool // Stopped sent

	client   csi.Client
	handoff  handoff
	fpActive bool // a fingerprint goroutine runs
	fpAgain  bool // run another when it ends
	failures int  // fingerprints failed in a row

	proc          *proc.Process
	ctr           *container.Container // the running container of an image allocation
	adopting      bool                 // proc was adopted and has not answered yet
	adoptTried    bool                 // the first start looked for a process to adopt
	killedFor     string               // why proc was killed to restart it ("" if it was not)
	exits         []time.Time          // exits within the restart window
	startFailures int                  // failed starts in a row
	restartStep   int                  // backoff step of the next restart

	hung           *timer    // fires HealthTimeout after unhealthySince
	unhealthySince time.Time // zero while healthy
	// The socket has not answered since dialSince (zero once connected);
	// the next warning about it is due at dialWarnAt, the one after
	// dialWarnEvery later.
	dialSince     time.Time
	dialWarnAt    time.Time
	dialWarnEvery time.Duration
	overdue       bool // an attached allocation passed HealthTimeout

	nodeTimeouts int  // node RPCs in a row that ended in DeadlineExceeded
	hungCheck    bool // a fingerprint runs to see whether the plugin still answers
}

// Receive handles one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.onStarted(ctx)
	case *actor.Restarting:
		a.onRestarting(ctx)
	case *actor.Stopping:
		a.onStopping(ctx)
	case *Shutdown:
		a.onShutdown(ctx, m)
	case *GetStatus:
		ctx.Respond(a.status)
	case *Refingerprint:
		a.fingerprintNow()
	case *heartbeat:
		if m.owner == a {
			a.onHeartbeat(ctx)
		}
	case *dialed:
		if m.owner == a {
			a.onDialed(ctx, m)
		}
	case *connChanged:
		if m.owner == a {
			a.onConnChanged(ctx, m)
		}
	case *fingerprinted:
		if m.owner == a {
			a.onFingerprinted(ctx, m)
		}
	case *procExited:
		if m.owner == a {
			a.onProcExited(ctx, m)
		}
	case *ctrExited:
		if m.owner == a {
			a.onCtrExited(ctx, m)
		}
	case *restartProcess:
		if m.owner == a {
			a.onRestartProcess(ctx)
		}
	case *healthTimedOut:
		if m.owner == a {
			a.onHealthTimedOut(ctx)
		}
	case *nodeCallEnded:
		if m.owner == a {
			a.onNodeCallEnded(m)
		}
	}
}
