package volume

import (
	"context"
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
//
// What is in flight lives in three places: the slot (the one RPC), allocs
// (per alloc: lookups, waiters, retries, claim actors) and expanding (the
// expansion). The record says where each claim is; these say only who
// waits and which goroutine runs.
type volumeActor struct {
	m   *Manager
	h   *handle
	log *logrus.Entry

	rec *persistence.Volume // last persisted record, never modified; nil when not registered
	// evicted: the record is being forgotten by Manager.Evict, which
	// records no event.
	evicted bool
	queue   []any // work waiting for the slot, in order
	slot    slot  // who holds the volume's one RPC slot
	// allocs is what is in flight for each alloc, by alloc: an entry
	// exists while something is (see allocWork).
	allocs    map[string]*allocWork
	expanding expansion     // the expansion in progress, when the record has one
	eph       ephemeralWork // an ephemeral volume's creation or deletion (see ephemeral.go)
	modifying expansion     // the modification in progress, when the record has one
	// forgetting are the allocs whose past claims the next persist
	// forgets without freeing them: no claim-freed event for them.
	forgetting []string
	// idle sends idleTimeout once nothing has been in flight for
	// Config.IdleTimeout (see settle); idleGen tells its message from a
	// stale timer's.
	idle    *time.Timer
	idleGen uint64
	// mirrored: this actor recorded a definition of the cluster (another
	// host registered or changed it) since its last claim; it stops once
	// idle for mirroredIdleTimeout instead of Config.IdleTimeout (a host
	// that joins or restarts in a cluster mirrors every volume, and would
	// otherwise hold an actor per volume for that long). A claim clears
	// it; a negative IdleTimeout keeps the actor.
	mirrored bool

	stopping   bool // restarting or stopping: start nothing new
	passivated bool // stopping because idle
	removed    bool // stopping because deregistered
}

// slot says who holds the volume's one RPC slot.
type slot struct {
	kind  slotKind
	alloc string     // slotPublish, slotLent: whose claim
	job   *claim.Job // slotPublish, slotOp: the goroutine that runs the RPC
}

type slotKind int

const (
	slotFree    slotKind = iota
	slotPublish          // a publish step of slot.alloc's claim runs in slot.job
	slotLent             // slot.alloc's claim actor runs a release step
	slotOp               // a controller call, forced teardown, expansion step or stats poll runs in slot.job
)

// occupy gives the slot to s and runs fn in its job: one RPC (or a few in
// a row) of the volume, whose message fn returns. The slot is free.
func (a *volumeActor) occupy(ctx actor.Context, s slot, fn func(context.Context) any) {
	a.slot = s
	a.slot.job = claim.StartJob(a.m.pool.pool, ctx.ActorSystem().Root, ctx.Self(), fn)
}

// vacate frees the slot when its job has sent its message.
func (a *volumeActor) vacate() {
	a.slot.job.Stop()
	a.slot = slot{}
}

// allocWork is what the volume actor has in flight for one alloc, beside
// what the record says of the alloc's claim or past claim. Each field is
// set only while its work lasts; work makes the entry and tidy drops it
// once nothing is left, so an alloc with an entry is work in flight.
type allocWork struct {
	// lookup looks up the node plugin for a new claim (not in the record
	// yet); lookupReqs are the requests for that claim, reserved when it
	// ends (see reserve).
	lookup     *claim.Job
	lookupReqs []*claimRequest
	// waiters are the callers of the claim being published, answered when
	// it is published or has failed.
	waiters []chan<- reply
	// retry waits out the backoff of the claim's failed publish step (or
	// owed NodeExpandVolume) and then sends retryDue; the claim's publish
	// steps wait for it.
	retry *claim.Job
	// expandAttempts counts the failures of the NodeExpandVolume the
	// claim's publish owes (Volume.NodeExpandPending), until it is done,
	// given up or the claim released.
	expandAttempts int
	// claimer is the claim actor that tears down the past claim.
	claimer *actor.PID
	// respawn starts the claim actor again, after a backoff, once its
	// supervisor stopped it for good (see childTerminated).
	respawn *claim.Job
	// forcing are the callers of the past claim's forced release; its
	// claim actor is not started again meanwhile.
	forcing []chan<- reply
}

func (w *allocWork) done() bool {
	return w.lookup == nil && len(w.lookupReqs) == 0 && len(w.waiters) == 0 && w.retry == nil &&
		w.expandAttempts == 0 && w.claimer == nil && w.respawn == nil && len(w.forcing) == 0
}

// work returns alloc's entry in a.allocs, making it if there is none.
func (a *volumeActor) work(alloc string) *allocWork {
	w := a.allocs[alloc]
	if w == nil {
		w = &allocWork{}
		a.allocs[alloc] = w
	}
	return w
}

// tidy drops alloc's entry when nothing is left in flight for it. Every
// handler that ends a piece of an alloc's work calls it.
func (a *volumeActor) tidy(alloc string) {
	if w := a.allocs[alloc]; w != nil && w.done() {
		delete(a.allocs, alloc)
	}
}

// expansion is what the volume actor has in flight for the expansion the
// record holds (Volume.Expansion), or for its modification
// (Volume.Modifying).
type expansion struct {
	waiters []chan<- reply // callers, answered when it is done or has failed
	// retry waits out the backoff of a failed step outside the slot (see
	// startExpansionJob); attempts counts that step's failures.
	retry    *claim.Job
	attempts int
}

func newVolumeActor(m *Manager, h *handle) *volumeActor {
	return &volumeActor{
		m:      m,
		h:      h,
		log:    m.log.WithField("volume", h.id),
		allocs: map[string]*allocWork{},
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
	case *ephemeralRequest:
		a.enqueue(ctx, msg)
	case *ephemeralRetryDue:
		a.ephemeralRetryDue(ctx, msg)
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
	case *recheckLooked:
		a.rechecked(ctx, msg)
	case *expandRetryDue:
		a.expandRetryDue(ctx, msg)
	case *modifyRequest:
		a.modifyArrived(ctx, msg)
	case *modifyFinished:
		a.modificationFinished(ctx, msg)
	case *modifyRetryDue:
		a.modifyRetryDue(ctx, msg)
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
