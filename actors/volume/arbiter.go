package volume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// Arbiter admits claims across the hosts of a cluster; the cluster
// package implements it. With Config.Arbiter set, a new claim that the
// volume's record admits is also admitted by the Arbiter before it is
// reserved, and a freed claim is handed to Free.
type Arbiter interface {
	// NodeID names this host in the cluster.
	NodeID() string
	// Admit records c (with NodeID, the node plugin's ID for this host,
	// and ControllerRequired, which a fence of this host needs) as this
	// host's claim on volume if fits, called with
	// the claims every host holds (NodeID set to the host), returns nil.
	// It returns fits's error as it is, or an error of its own when it
	// cannot decide (etcd unreachable, this host's lease not renewed).
	Admit(ctx context.Context, volume string, c persistence.Claim, fits func(held []persistence.Claim) error) error
	// Free forgets this host's claim of alloc on volume. It must not
	// block: it retries in the background.
	Free(volume, alloc string)
}

// ErrArbiterUnavailable is returned (wrapping the Arbiter's error) by
// Claim when the Arbiter could not decide: the cluster is unreachable, or
// this host's lease was not renewed in time. Nothing was reserved; the
// claims already published are not affected.
var ErrArbiterUnavailable = errors.New("cluster arbiter unavailable")

// DefaultArbiterTimeout bounds one Arbiter.Admit; the volume actor waits
// for it.
const DefaultArbiterTimeout = 5 * time.Second

// admitHosts asks the Arbiter, if any, to admit req on the volume. It
// blocks the actor for one etcd round trip (a few when hosts race).
func (a *volumeActor) admitHosts(req claim.Request, facts claim.Facts) error {
	arb := a.m.cfg.Arbiter
	if arb == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultArbiterTimeout)
	defer cancel()
	c := persistence.Claim{Alloc: req.Alloc, Mode: string(req.Mode),
		AccessMode: req.Capability.AccessMode.String(), AttachmentMode: req.Capability.AttachmentMode.String(),
		NodeID: facts.NodeID, ControllerRequired: facts.ControllerRequired}
	host := arb.NodeID()
	err := arb.Admit(ctx, a.h.id, c, func(held []persistence.Claim) error {
		return claim.AdmitHosts(host, req, held)
	})
	if err != nil && !isClaimError(err) {
		return fmt.Errorf("%w: %w", ErrArbiterUnavailable, err)
	}
	return err
}

func isClaimError(err error) bool {
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrInvalid)
}

// freeHosts hands to the Arbiter, if any, the claims of old that are gone
// from cur (freed, or never reserved).
func (a *volumeActor) freeHosts(old, cur *persistence.Volume) {
	arb := a.m.cfg.Arbiter
	if arb == nil || old == nil {
		return
	}
	for _, list := range [][]persistence.Claim{old.Claims, old.PastClaims} {
		for i := range list {
			alloc := list[i].Alloc
			if cur != nil && (claim.FindClaim(cur.Claims, alloc) >= 0 || claim.FindClaim(cur.PastClaims, alloc) >= 0) {
				continue
			}
			arb.Free(a.h.id, alloc)
		}
	}
}
