package actorkit

import (
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
)

// ChildGaveUp is sent to a supervising actor by its [Supervisor] strategy
// when one of its children failed more than MaxFailures times within
// Window: the child has been stopped and will not be restarted. The parent
// receives the child's *actor.Terminated as well (in either order).
type ChildGaveUp struct {
	// Child is the stopped child.
	Child *actor.PID
	// Reason is what the last failure panicked with.
	Reason any
	// Failures is the number of failures counted within the window.
	Failures int
}

// Failure describes one failure of a supervised child, for the hooks.
type Failure struct {
	Child  *actor.PID
	Reason any
	// Failures is the number of failures within the window, this one included.
	Failures int
	// Delay is how long the child waits before it is restarted (zero when
	// the supervisor gave up).
	Delay time.Duration
}

// Hooks are called by a [Supervisor] from the supervising actor's
// goroutine; they must not block. Each is optional.
type Hooks struct {
	// OnRestart is called when a child is scheduled for restart.
	OnRestart func(Failure)
	// OnGiveUp is called when the supervisor stops a child for good.
	OnGiveUp func(Failure)
}

// Supervisor is an [actor.SupervisorStrategy] that handles each failing
// child alone (one-for-one): it restarts the child after an exponential,
// jittered, capped delay, and after more than MaxFailures failures within
// Window it stops the child and sends [ChildGaveUp] to the parent.
//
// While a child waits for its restart its mailbox is suspended: messages
// sent to it queue up and are handled by the restarted actor. The message
// that failed is lost (that is protoactor's contract).
//
// A Supervisor is safe for concurrent use by several parents. Close it
// when the actor system shuts down, so that no restart timer fires after.
type Supervisor struct {
	kind     string
	cfg      BackoffConfig
	log      *logrus.Entry
	hooks    Hooks
	restarts *RestartCounter
	rand     func() float64 // nil means math/rand/v2

	mu     sync.Mutex
	timers map[*time.Timer]struct{} // guarded by mu
	closed bool                     // guarded by mu
}

var _ actor.SupervisorStrategy = (*Supervisor)(nil)

// NewSupervisor returns a strategy for children of the given kind (a label
// like "plugin" or "volume", used in logs and in restarts). restarts may
// be nil.
func NewSupervisor(kind string, cfg BackoffConfig, log *logrus.Entry, restarts *RestartCounter, hooks Hooks) (*Supervisor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("supervisor %s: %w", kind, err)
	}
	restarts.Init(kind) // the kind's counter exists at 0 from now on
	return &Supervisor{
		kind:     kind,
		cfg:      cfg.WithDefaults(),
		log:      log.WithField("supervisor", kind),
		hooks:    hooks,
		restarts: restarts,
		timers:   map[*time.Timer]struct{}{},
	}, nil
}

// HandleFailure implements [actor.SupervisorStrategy]. protoactor calls it
// on the supervising actor's goroutine.
func (s *Supervisor) HandleFailure(system *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason any, _ any) {
	// Forget failures older than the window, so the list stays short and a
	// child that ran well for a while starts again from Initial.
	if rs.NumberOfFailures(s.cfg.Window) == 0 {
		rs.Reset()
	}
	rs.Fail()
	n := rs.NumberOfFailures(s.cfg.Window)
	f := Failure{Child: child, Reason: reason, Failures: n}
	log := s.log.WithField("child", child.Id).WithField("failures", n)
	if err, ok := reason.(error); ok {
		log = log.WithError(err)
	} else {
		log = log.WithField("reason", fmt.Sprint(reason))
	}

	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()

	if closed || n > s.cfg.MaxFailures {
		rs.Reset()
		if closed {
			log.Warn("actor failed during shutdown; stopping it")
		} else {
			log.Error("actor keeps failing; giving up and stopping it")
		}
		system.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.StopDirective})
		sup.StopChildren(child)
		if s.hooks.OnGiveUp != nil {
			s.hooks.OnGiveUp(f)
		}
		if p, ok := sup.(interface{ Self() *actor.PID }); ok && p.Self() != nil {
			system.Root.Send(p.Self(), &ChildGaveUp{Child: child, Reason: reason, Failures: n})
		}
		return
	}

	r := s.rand
	if r == nil {
		f.Delay = s.cfg.Next(n)
	} else {
		f.Delay = s.cfg.Jittered(n, r())
	}
	log.WithField("delay", f.Delay).Warn("actor failed; restarting it after a delay")
	s.restarts.Inc(s.kind)
	if s.hooks.OnRestart != nil {
		s.hooks.OnRestart(f)
	}

	restart := func() {
		system.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.RestartDirective})
		sup.RestartChildren(child)
	}
	if f.Delay <= 0 {
		restart()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(f.Delay, func() {
		s.mu.Lock()
		_, pending := s.timers[t]
		delete(s.timers, t)
		s.mu.Unlock()
		if pending {
			restart()
		}
	})
	s.timers[t] = struct{}{}
}

// Pending returns the number of restarts waiting for their delay.
func (s *Supervisor) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.timers)
}

// Close cancels every pending restart and makes later failures stop the
// failing child instead of restarting it. It is idempotent.
func (s *Supervisor) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for t := range s.timers {
		t.Stop()
		delete(s.timers, t)
	}
}
