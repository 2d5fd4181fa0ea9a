package runtime

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Readiness statuses (Readiness.Status).
const (
	// ReadyOK: restore and the host check are done; every claim the host
	// was missing is published again.
	ReadyOK = "ok"
	// ReadyStarting: something is still pending.
	ReadyStarting = "starting"
)

// maxPending bounds the pending items Ready lists.
const maxPending = 50

// Readiness says whether the agent has finished starting: GET /v1/ready.
type Readiness struct {
	// Status is ReadyOK or ReadyStarting.
	Status string `json:"status"`
	// Pending lists what is still pending, at most 50 items (the last one
	// then says how many more there are): allocations restored or
	// registered that have not answered their first fingerprint, in
	// cluster mode the first read of the volume definitions from etcd,
	// and volumes with a claim the host was missing that is not published
	// again yet (with its last error when an attempt failed).
	Pending []string `json:"pending,omitempty"`
}

// Ready reports whether the agent has finished starting: every allocation
// has answered its first fingerprint (healthy or not), every claim the
// host check found missing (after a reboot, or a mount gone) is published
// again, and in cluster mode every volume definition in etcd has been
// read once (so the agent lists and claims every volume of the cluster). Once ready, the runtime stays ready: later repairs show in the
// claims' Condition, not here. The runtime asks itself until it is ready,
// so the moment does not depend on when Ready is first called. A repair
// that keeps failing keeps the runtime starting, and Pending names it with
// its error.
func (r *Runtime) Ready(ctx context.Context) (Readiness, error) {
	if err := r.ready(); err != nil {
		return Readiness{}, err
	}
	return r.readiness(ctx)
}

// readiness is Ready for a caller that knows the runtime started (it
// takes no lock: watchReady runs while Shutdown holds r.life).
func (r *Runtime) readiness(ctx context.Context) (Readiness, error) {
	if r.isReady.Load() {
		return Readiness{Status: ReadyOK}, nil
	}
	var pending []string
	allocs, err := r.registry.Allocations(ctx)
	if err != nil {
		return Readiness{}, mapErr(err)
	}
	for _, a := range allocs {
		if !a.Healthy && strings.HasPrefix(a.HealthDescription, "starting") {
			pending = append(pending, fmt.Sprintf("allocation %s (plugin %s): %s", a.ID, a.Plugin, a.HealthDescription))
		}
	}
	if r.cluster != nil && !r.clusterListed.Load() {
		pending = append(pending, "cluster: reading the volume definitions from etcd")
	}
	ids := r.volumes.Repairing()
	sort.Strings(ids)
	total := len(pending) + len(ids)
	for _, id := range ids {
		if len(pending) >= maxPending {
			break
		}
		pending = append(pending, r.repairPending(ctx, id))
	}
	if total == 0 {
		if r.isReady.CompareAndSwap(false, true) {
			r.log.Info("agent ready: restore and host check done")
		}
		return Readiness{Status: ReadyOK}, nil
	}
	if total > maxPending {
		pending = append(pending[:maxPending-1], fmt.Sprintf("and %d more", total-maxPending+1))
	}
	return Readiness{Status: ReadyStarting, Pending: pending}, nil
}

// readyPoll is how often watchReady asks Ready until it says ok.
const readyPoll = 100 * time.Millisecond

// watchReady asks Ready until it says ok (which latches it and logs "agent
// ready"), so that readiness is decided when the agent gets there, not at
// the first GET /v1/ready: a plugin that restarts an hour later does not
// make the agent starting again.
func (r *Runtime) watchReady() {
	defer r.wg.Done()
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() { // ends with watchReady
		select {
		case <-r.done:
			cancel()
		case <-stop:
		}
	}()
	for {
		if rd, err := r.readiness(ctx); err == nil && rd.Status == ReadyOK {
			return
		}
		select {
		case <-t.C:
		case <-r.done:
			return
		}
	}
}

// repairPending describes volume id's claims that are being repaired.
func (r *Runtime) repairPending(ctx context.Context, id string) string {
	v, err := r.volumes.Get(ctx, id)
	if err != nil {
		return "volume " + id + ": repairing"
	}
	var parts []string
	for _, c := range v.Claims {
		if c.Repair == "" {
			continue
		}
		s := fmt.Sprintf("alloc %s %s (%s)", c.Alloc, c.Condition, c.Repair)
		if c.LastError != "" {
			s += ": " + c.LastError
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "volume " + id + ": repairing"
	}
	return "volume " + id + ": " + strings.Join(parts, "; ")
}
