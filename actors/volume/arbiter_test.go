package volume

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

// orderArbiter admits every claim and, when a claim is handed to Free,
// reads the volume's status as any caller would: a claim that the status
// already shows freed then was freed here before the Arbiter heard of it.
type orderArbiter struct {
	m atomic.Pointer[Manager]

	mu    sync.Mutex
	freed []string // guarded by mu; the allocs handed to Free
	early []string // guarded by mu; those the status showed freed first
}

func (a *orderArbiter) NodeID() string { return "n1" }

func (a *orderArbiter) Admit(_ context.Context, _ string, _ persistence.Claim, fits func([]persistence.Claim) error) error {
	return fits(nil)
}

func (a *orderArbiter) Free(volume, alloc string) {
	v, err := a.m.Load().Get(context.Background(), volume)
	shown := err == nil && slices.ContainsFunc(slices.Concat(v.Claims, v.PastClaims), func(c Claim) bool { return c.Alloc == alloc })
	a.mu.Lock()
	defer a.mu.Unlock()
	a.freed = append(a.freed, alloc)
	if !shown {
		a.early = append(a.early, alloc)
	}
}

// TestManager_Arbiter_FreedBeforeShown: a freed claim is handed to the
// Arbiter before the volume's status shows it gone, so that whoever reads
// the status as freed finds this host's claim freed for the cluster too
// (a deregistration or update on this host right after then does not
// find it in etcd as held). Shown first, the claim was, for a moment,
// freed here and held in the cluster.
func TestManager_Arbiter_FreedBeforeShown(t *testing.T) {
	arb := &orderArbiter{}
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.Arbiter = arb }))
	arb.m.Store(e.m)
	e.register("v")
	if _, err := e.m.Claim(ctxT(t), claimReq("v", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Release(ctxT(t), "v", "a"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("v")
	arb.mu.Lock()
	defer arb.mu.Unlock()
	if !slices.Equal(arb.freed, []string{"a"}) || len(arb.early) != 0 {
		t.Errorf("handed to Free: %v, of which the status showed freed first: %v; want [a], none", arb.freed, arb.early)
	}
}
