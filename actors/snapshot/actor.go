package snapshot

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// snapActor owns every snapshot record: it is the only writer, persists
// each step before the next one starts, and runs each snapshot's RPC in a
// goroutine it owns.
type snapActor struct {
	m      *Manager
	loaded chan<- error // told once the records are loaded (first start)

	recs     map[string]*persistence.Snapshot // last persisted records, never modified
	ops      map[string]*op                   // creates and deletes under way, by snapshot
	holds    map[string]int                   // the manager's: restores under way, by snapshot
	stopping bool
}

// op is a create or delete under way: its goroutine and its callers.
type op struct {
	delete  bool
	job     *claim.Job
	waiters []chan<- reply
}

func newSnapActor(m *Manager, loaded chan<- error) *snapActor {
	return &snapActor{m: m, loaded: loaded, recs: map[string]*persistence.Snapshot{}, ops: map[string]*op{}, holds: m.holds}
}

// Receive handles the snapshot actor's messages.
func (a *snapActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.started(ctx)
	case *createRequest:
		a.create(ctx, msg)
	case *deleteRequest:
		a.delete(ctx, msg)
	case *getRequest:
		a.get(msg)
	case *listRequest:
		a.list(msg)
	case *holdRequest:
		a.hold(msg)
	case *unholdRequest:
		a.unhold(msg)
	case *progress:
		a.progress(msg)
	case *opDone:
		a.opDone(msg)
	case *actor.Restarting:
		a.stopWork()
	case *actor.Stopping:
		a.stopWork()
	case *actor.Stopped:
		close(a.m.stopped)
	}
}
