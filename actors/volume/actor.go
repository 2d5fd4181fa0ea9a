package volume

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/persistence"
)

// volumeActor owns one volume's record: it is the only writer, persists
// every step before the next one starts, and runs at most one RPC of the
// volume at a time (its "slot"), in a goroutine it owns, so its mailbox
// never waits for a plugin. Claim actors (children) drive released claims;
// they run their steps when the volume lends them the slot.
type volumeActor struct {
	m   *Manager
	h   *handle
	log *logrus.Entry

	rec      *persistence.Volume       // last persisted record, never modified; nil when not registered
	queue    []any                     // work waiting for the slot, in order
	slot     slot                      // who holds the volume's one RPC slot
	job      *claim.Job                // the goroutine of the slot's publish step, create or delete
	lookups  map[string]*lookup        // node plugin lookups for new claims, by alloc
	retries  map[string]*claim.Job     // publish steps waiting to retry, by alloc
	waiters  map[string][]chan<- reply // callers of claims being published, by alloc
	claimers map[string]*actor.PID     // claim actors, by alloc
	respawns map[string]*claim.Job     // claim actors to start again, by alloc
	// expandWaiters are the callers of the expansion in progress.
	expandWaiters []chan<- reply
	// forcing are the callers of forced releases, by alloc: the claim
	// actor of such a past claim is not started again.
	forcing map[string][]chan<- reply
	// forgetting are the allocs whose past claims the next persist
	// forgets without freeing them: no claim-freed event for them.
	forgetting []string
	// expandRetry waits out the backoff of a failed expansion step,
	// outside the slot; expandAttempts counts that step's failures.
	expandRetry    *claim.Job
	expandAttempts int
	// pendingAttempts counts the failures of the NodeExpandVolume a
	// publish owes (Volume.NodeExpandPending), by alloc.
	pendingAttempts map[string]int
	idle            *time.Timer
	idleGen         uint64

	stopping   bool // restarting or stopping: start nothing new
	passivated bool // stopping because idle
	removed    bool // stopping because deregistered
}

func newVolumeActor(m *Manager, h *handle) *volumeActor {
	return &volumeActor{
		m:        m,
		h:        h,
		log:      m.log.WithField("volume", h.id),
		lookups:  map[string]*lookup{},
		retries:  map[string]*claim.Job{},
		waiters:  map[string][]chan<- reply{},
		claimers: map[string]*actor.PID{},
		respawns: map[string]*claim.Job{},

		pendingAttempts: map[string]int{},
	}
}

// Receive handles the volume actor's messages.
func (a *volumeActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.started(ctx)
	case *registerRequest:
		a.enqueue(ctx, msg)
	case *deregisterRequest:
		a.enqueue(ctx, msg)
	case *claimRequest:
		a.claim(ctx, msg)
	case *reconcileRequest:
		a.enqueue(ctx, msg)
	case *factsResolved:
		a.reserve(ctx, msg)
	case *stepFinished:
		a.stepFinished(ctx, msg)
	case *retryDue:
		a.retryDue(ctx, msg)
	case *releaseRequest:
		a.release(ctx, msg)
	case *forceReleaseRequest:
		a.forceRelease(ctx, msg)
	case *forceFinished:
		a.forceFinished(ctx, msg)
	case *claim.TurnRequest:
		a.turnRequested(ctx, msg)
	case *claim.StepDone:
		a.releaseStepDone(ctx, msg)
	case *opFinished:
		a.opFinished(ctx, msg)
	case *expandRequest:
		a.enqueue(ctx, msg)
	case *expandFinished:
		a.expansionFinished(ctx, msg)
	case *statsRequest:
		a.enqueue(ctx, msg)
	case *statsFinished:
		a.statsFinished(ctx, msg)
	case *expandRetryDue:
		a.expandRetryDue(ctx, msg)
	case *pendingExpandFinished:
		a.pendingExpandFinished(ctx, msg)
	case *respawnClaimer:
		a.respawnClaimer(ctx, msg)
	case *actor.Terminated:
		a.childTerminated(ctx, msg)
	case *actorkit.ChildGaveUp:
		a.childGaveUp(msg)
	case *idleTimeout:
		a.idleTimeout(ctx, msg)
	case *actor.Restarting:
		a.restarting()
	case *actor.Stopping:
		a.stoppingNow()
	case *actor.Stopped:
		a.stopped()
	}
}
