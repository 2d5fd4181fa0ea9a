package volume

import (
	"github.com/csiactor/csiactor/actors/claim"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/persistence"
)

// snapshot is what a volume actor last persisted: nil rec when the volume
// is not registered. Published snapshots are never modified.
type snapshot struct {
	rec *persistence.Volume
}

// handle is the manager's side of one volume actor: how to reach it, its
// last snapshot for status reads, and the signals waiters need. A handle
// lives as long as its actor (restarts included); a passivated or stopped
// volume gets a new handle when it is needed again.
type handle struct {
	id      string
	pid     *actor.PID        // set before the handle is shared
	stopped chan struct{}     // closed when the actor has stopped for good
	disp    *claim.Dispatcher // the actor's mailbox dispatcher; set before the handle is shared

	snap atomic.Pointer[snapshot]

	// guarded by Manager.mu
	pending int  // requests sent and not yet answered
	gone    bool // no longer in Manager.live

	// guarded by Manager.countsMu
	counted   *persistence.Volume // the record counted in csiactor_volume_claims
	baselined bool                // counted is meaningful

	mu   sync.Mutex
	lost chan struct{} // guarded by mu; closed when an incarnation ends
}

func newHandle(id string) *handle {
	return &handle{id: id, stopped: make(chan struct{}), lost: make(chan struct{})}
}

// lostCh returns the channel closed when the actor's current incarnation
// ends (a restart or a stop): requests it held in memory are gone then, and
// waiters send theirs again (every request is idempotent).
func (h *handle) lostCh() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

func (h *handle) incarnationEnded() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.lost)
	h.lost = make(chan struct{})
}
