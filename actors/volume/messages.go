package volume

import (
	"context"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// reply is what a volume actor answers a request with.
type reply struct {
	vol      *persistence.Volume // the record after the request (never modified)
	claim    persistence.Claim
	repaired int      // reconcileRequest: claims sent back through their publish steps
	left     []string // forced release or deregistration: what may be left
	err      error
}

// registerRequest is sent to a volume actor by Manager.Register,
// Manager.Create and Manager.Mirror (mirror set). ctx is the caller's, for
// the CreateVolume call.
type registerRequest struct {
	ctx    context.Context
	spec   Spec
	create bool
	mirror bool
	reply  chan<- reply
}

// deregisterRequest is sent to a volume actor by Manager.Deregister and
// Manager.Delete (delete set: DeleteVolume first). ctx is the caller's.
type deregisterRequest struct {
	ctx    context.Context
	delete bool
	force  bool     // forget past claims that are not freed (ForceDeregister)
	evict  bool     // forget the record only, without an event (Evict)
	left   []string // force: what the past claims may leave
	reply  chan<- reply
}

// claimRequest is sent to a volume actor by Manager.Claim. The reply comes
// when the claim is published or has failed.
type claimRequest struct {
	req   claim.Request
	reply chan<- reply
}

// releaseRequest is sent to a volume actor by Manager.Release. The reply
// comes as soon as the past claim is recorded.
type releaseRequest struct {
	alloc string
	reply chan<- reply
}

// reconcileRequest is sent to a volume actor by Manager.Reconcile with
// view, what the host had mounted at asOf. The reply comes when the claims
// the host is missing are recorded as repairing (see claim.CheckHost); it
// waits in the actor's queue for the slot, so that no publish step is in
// flight while the claims are checked.
type reconcileRequest struct {
	view  claim.HostView
	asOf  time.Time
	reply chan<- reply
}

// factsResolved is sent to a volume actor by the goroutine that looked up
// the node plugin for a new claim of alloc.
type factsResolved struct {
	owner *volumeActor
	alloc string
	facts claim.Facts
	err   error
}

// stepFinished is sent to a volume actor by the goroutine that ran one
// publish step of a claim.
type stepFinished struct {
	owner *volumeActor
	step  claim.Step
	res   claim.Result
	// stagingMounted: after a NodeStageVolume that succeeded, the staging
	// path is a mount point (see persistence.Staging.Mounted).
	stagingMounted bool
}

// retryDue is sent to a volume actor by the goroutine that waited out a
// failed publish step of alloc's claim (backoff, then plugin health).
type retryDue struct {
	owner *volumeActor
	alloc string
}

// recheckLooked is sent to a volume actor by the job of a recheckWork once
// it has looked at the host (view, or err) for a repeated claim of alloc,
// the volume's mount points probed.
type recheckLooked struct {
	owner *volumeActor
	alloc string
	view  claim.HostView
	err   error
}

// opFinished is sent to a volume actor by the goroutine that ran a
// controller call: CreateVolume (req is a *registerRequest with create
// set; out is the *csipb.Volume created), ValidateVolumeCapabilities (req
// is a *registerRequest; out is the *validation) or DeleteVolume (req is
// a *deregisterRequest).
type opFinished struct {
	owner *volumeActor
	req   any
	res   claim.Result
	out   any
}

// respawnClaimer is sent to a volume actor by a timer when it is time to
// start again the claim actor of alloc, after that actor was stopped for
// good by its supervisor.
type respawnClaimer struct {
	owner *volumeActor
	alloc string
}

// idleTimeout is sent to a volume actor by its idle timer; gen tells a stale
// timer from the current one.
type idleTimeout struct {
	owner *volumeActor
	gen   uint64
}
