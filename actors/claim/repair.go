package claim

import (
	"slices"
	"strings"
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

// BrokenView is a HostView that also probed the mount points it lists:
// Broken names why a mount point that is in the mount table is dead (the
// mountprobe causes: ENOTCONN, EIO, ESTALE, timeout), or is "" when it
// answered or was not probed. Its Mounted is false for a broken one.
type BrokenView interface {
	HostView
	Broken(path string) string
}

// brokenMark is what a repair's name holds after what was missing when
// the mount point was there but dead: "target path broken (ENOTCONN)".
const brokenMark = " broken ("

// withCause names a repair of what, found broken (cause) rather than
// missing.
func withCause(what string, host HostView, path string) string {
	if bv, ok := host.(BrokenView); ok {
		if cause := bv.Broken(path); cause != "" {
			return what + brokenMark + cause + ")"
		}
	}
	return what
}

// BrokenCause returns the cause of a repair that CheckHost started because
// a mount point was dead (ENOTCONN, EIO, ESTALE, timeout), or "" for a
// repair of something missing.
func BrokenCause(repair string) string {
	i := strings.Index(repair, brokenMark)
	if i < 0 || !strings.HasSuffix(repair, ")") {
		return ""
	}
	return repair[i+len(brokenMark) : len(repair)-1]
}

// CheckHost compares v's claims with the host (in place) and sends every
// claim whose volume is not where the record says back through its publish
// steps: the claim goes to state lost with Repair naming what was missing
// (or, with a BrokenView, what was found dead and why),
// and a staging found missing is marked unstaged and lost, so that
// NextPublish resets what the plugin recorded (NodeUnpublishVolume of the
// target, then NodeUnstageVolume of a lost staging once no target on it is
// left) and runs NodeStageVolume (when the staging is gone) and
// NodePublishVolume again: the plugin ends with exactly what the claims
// own. It returns the allocations of the claims sent
// back; changed reports whether v was modified.
//
// With bootChanged, the host rebooted: every current claim is redone from
// the start (ControllerPublishVolume too, when the claim needs it: the
// attachment is uncertain), and every staging is marked unstaged.
// Otherwise only published claims and their stagings are checked, and only
// those last changed before asOf (when the host was looked at): a claim
// published since then is not in that picture. A published claim's target
// is in place when it is mounted or linked; its staging when it is mounted,
// or when it was not a mount point after NodeStageVolume (Staging.Mounted
// unset: a plugin that stages without mounting, or links, stages nothing
// the mount table could show lost).
//
// Past claims are left alone: their teardown is idempotent.
func CheckHost(v *persistence.Volume, host HostView, bootChanged bool, asOf, now time.Time) (repaired []string, changed bool) {
	regress := func(c *persistence.Claim, why string) {
		if c.Repair == "" || why == RepairBootID {
			c.Repair = why
		}
		c.State, c.LastError, c.Attempts, c.UpdatedAt = StateLost, "", 0, now
		repaired = append(repaired, c.Alloc)
		changed = true
	}
	if bootChanged {
		if len(v.Claims) == 0 {
			return nil, false
		}
		// The plugin may keep its own record across the reboot (the
		// hostpath driver does, on disk): every staging is reset and
		// every claim unpublished before it is published again, a claim
		// still reserved too (its NodePublishVolume may have run before
		// its outcome was recorded).
		for i := range v.Stagings {
			if st := &v.Stagings[i]; st.Staged || !st.Lost {
				st.Staged, st.Lost = false, true
				changed = true
			}
		}
		for i := range v.Claims {
			c := &v.Claims[i]
			if c.ControllerRequired && v.ControllerPublished {
				v.ControllerPublished = false
				changed = true
			}
			if c.State != StateLost || c.Repair != RepairBootID {
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
		if !st.Staged || !st.Mounted || host.Mounted(st.Path) {
			continue // only a staging that was mounted can be found lost
		}
		if !slices.ContainsFunc(st.Users, func(u string) bool {
			j := FindClaim(v.Claims, u)
			return j >= 0 && checked(&v.Claims[j])
		}) {
			continue
		}
		st.Staged, st.Lost = false, true
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
				regress(c, withCause(RepairStagingAndTarget, host, st.Path))
			} else {
				regress(c, withCause(RepairStaging, host, st.Path))
			}
		}
	}
	for i := range v.Claims {
		c := &v.Claims[i]
		if checked(c) && targetGone(c) {
			regress(c, withCause(RepairTarget, host, c.TargetPath))
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
