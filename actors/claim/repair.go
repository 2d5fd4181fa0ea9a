package claim

import (
	"slices"
	"time"

	"github.com/csiactor/csiactor/persistence"
)

// What a repair names (persistence.Claim.Repair): what the host was found
// missing for a claim the record says is published.
const (
	// RepairTarget: the claim's target path is not mounted.
	RepairTarget = "target path"
	// RepairStaging: the staging path the claim uses is not mounted.
	RepairStaging = "staging path"
	// RepairStagingAndTarget: neither is.
	RepairStagingAndTarget = "staging path and target path"
	// RepairBootID: the host rebooted since the claim was published, so
	// nothing of it (attachment, staging, target) can be trusted.
	RepairBootID = "boot ID changed"
)

// HostView tells what is in place on the host.
type HostView interface {
	// Mounted reports whether path is a mount point.
	Mounted(path string) bool
	// Linked reports whether path is a symlink to an existing directory:
	// how a plugin that cannot mount (the example plugin without root)
	// publishes a volume.
	Linked(path string) bool
}

// CheckHost compares v's claims with the host (in place) and sends every
// claim whose volume is not where the record says back through its publish
// steps: the claim returns to state reserved with Repair naming what was
// missing, and a staging found missing is marked unstaged, so that
// NextPublish runs NodeStageVolume (when the staging is gone) and
// NodePublishVolume again. It returns the allocations of the claims sent
// back; changed reports whether v was modified.
//
// With bootChanged, the host rebooted: every current claim is redone from
// the start (ControllerPublishVolume too, when the claim needs it: the
// attachment is uncertain), and every staging is marked unstaged.
// Otherwise only published claims and their stagings are checked, and only
// those last changed before asOf (when the host was looked at): a claim
// published since then is not in that picture. A published claim's target
// is in place when it is mounted or linked; its staging when it is mounted,
// or when a target of its users is linked (a plugin that links stages
// nothing it could lose).
//
// Past claims are left alone: their teardown is idempotent.
func CheckHost(v *persistence.Volume, host HostView, bootChanged bool, asOf, now time.Time) (repaired []string, changed bool) {
	regress := func(c *persistence.Claim, why string) {
		if c.Repair == "" || why == RepairBootID {
			c.Repair = why
		}
		c.State, c.LastError, c.Attempts, c.UpdatedAt = StateReserved, "", 0, now
		repaired = append(repaired, c.Alloc)
		changed = true
	}
	if bootChanged {
		if len(v.Claims) == 0 {
			return nil, false
		}
		for i := range v.Stagings {
			if v.Stagings[i].Staged {
				v.Stagings[i].Staged = false
				changed = true
			}
		}
		for i := range v.Claims {
			c := &v.Claims[i]
			if c.ControllerRequired && v.ControllerPublished {
				v.ControllerPublished = false
				changed = true
			}
			if c.State != StateReserved || c.Repair != "" {
				regress(c, RepairBootID)
			}
		}
		return repaired, changed
	}
	checked := func(c *persistence.Claim) bool {
		return c.State == StatePublished && c.UpdatedAt.Before(asOf)
	}
	targetGone := func(c *persistence.Claim) bool {
		return !host.Mounted(c.TargetPath) && !host.Linked(c.TargetPath)
	}
	for i := range v.Stagings {
		st := &v.Stagings[i]
		if !st.Staged || host.Mounted(st.Path) {
			continue
		}
		users, linked := 0, false
		for _, u := range st.Users {
			j := FindClaim(v.Claims, u)
			if j < 0 || !checked(&v.Claims[j]) {
				continue
			}
			users++
			linked = linked || host.Linked(v.Claims[j].TargetPath)
		}
		if users == 0 || linked {
			continue
		}
		st.Staged = false
		changed = true
		// Its users in state staged too: their NodePublishVolume would
		// publish the empty staging directory.
		for j := range v.Claims {
			c := &v.Claims[j]
			stale := checked(c) || (c.State == StateStaged && c.UpdatedAt.Before(asOf))
			if c.StagingPath != st.Path || !slices.Contains(st.Users, c.Alloc) || !stale {
				continue
			}
			if checked(c) && targetGone(c) {
				regress(c, RepairStagingAndTarget)
			} else {
				regress(c, RepairStaging)
			}
		}
	}
	for i := range v.Claims {
		c := &v.Claims[i]
		if checked(c) && targetGone(c) {
			regress(c, RepairTarget)
		}
	}
	return repaired, changed
}

// Repairing reports whether v has a claim going through its publish steps
// again because the host was missing something (see CheckHost).
func Repairing(v *persistence.Volume) bool {
	for i := range v.Claims {
		if v.Claims[i].Repair != "" {
			return true
		}
	}
	return false
}
