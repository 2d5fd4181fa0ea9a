package claim

import (
	"maps"
	"slices"
	"time"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

// Reserve adds r's claim to v (in place) in state reserved and returns a copy
// of it. Admit must have allowed r. When the node plugin stages volumes, the
// claim becomes a user of the volume's staging (created unstaged, at the
// path of the claim's usage, when there is none): usage counts are recorded
// before any RPC, so a teardown after a crash knows who may have staged.
//
// A volume has at most one staging at a time, as the CSI spec requires
// ("the CO SHALL ensure that there is only one staging_target_path per
// volume"): every claim that holds a place has the same access and
// attachment mode (see Admit), and NodeStageVolume has no read-only flag,
// so a read claim and a write claim share the staging made by the first.
func Reserve(v *persistence.Volume, r Request, f Facts, dataDir string, now time.Time) persistence.Claim {
	usage := Usage(r.Mode, r.Capability)
	c := persistence.Claim{
		Alloc:              r.Alloc,
		Mode:               string(r.Mode),
		AccessMode:         r.Capability.AccessMode.String(),
		AttachmentMode:     r.Capability.AttachmentMode.String(),
		State:              StateReserved,
		Usage:              usage,
		TargetPath:         TargetPath(dataDir, v.Plugin, r.Alloc, v.ID, usage),
		NodeID:             f.NodeID,
		ControllerRequired: f.ControllerRequired,
		CreatedAt:          now,
		UpdatedAt:          now,
	}
	setOptions(v, &c, r.Options)
	if f.StageUnstage {
		c.StagingPath = StagingPath(dataDir, v.Plugin, v.ID, usage)
		if len(v.Stagings) > 0 {
			c.StagingPath = v.Stagings[0].Path
		}
		addUser(v, usage, c.StagingPath, r.Alloc)
	}
	v.Claims = append(v.Claims, c)
	return c
}

func addUser(v *persistence.Volume, usage, path, alloc string) {
	i := FindStaging(v, path)
	if i < 0 {
		v.Stagings = append(v.Stagings, persistence.Staging{Usage: usage, Path: path})
		i = len(v.Stagings) - 1
	}
	st := &v.Stagings[i]
	if !slices.Contains(st.Users, alloc) {
		st.Users = append(st.Users, alloc)
	}
}

// NextPublish returns the next RPC of alloc's current claim on v, and false
// when the claim is published (or not there).
func NextPublish(v *persistence.Volume, alloc string) (Step, bool) {
	i := FindClaim(v.Claims, alloc)
	if i < 0 {
		return Step{}, false
	}
	c := &v.Claims[i]
	switch c.State {
	case StatePublished:
		return Step{}, false
	case StateLost:
		// Drivers keep their own record of what they published (the
		// hostpath driver lists a target once per NodePublishVolume):
		// publishing a lost target again without unpublishing it first
		// would leave one entry no release ever removes.
		return stepFor(v, c, NodeUnpublish), true
	case StateReserved:
		if c.ControllerRequired && !v.ControllerPublished {
			return stepFor(v, c, ControllerPublish), true
		}
		fallthrough
	case StateControllerPublished, StateStaged:
		// A staged claim whose staging is marked unstaged (see
		// Unstaged) is staged again before its NodePublishVolume.
		if c.StagingPath != "" {
			// A staging missing from the record (it cannot be, Reserve
			// adds it) is staged again; ApplyPublish records it.
			if j := FindStaging(v, c.StagingPath); j < 0 || !v.Stagings[j].Staged {
				if j >= 0 && v.Stagings[j].Lost && !stagingHeld(v, c) {
					// Lost on the host: reset the plugin's record of it
					// first, once no target on it is left to unpublish.
					return stepFor(v, c, NodeUnstage), true
				}
				return stepFor(v, c, NodeStage), true
			}
		}
	}
	return stepFor(v, c, NodePublish), true
}

// stagingHeld reports whether a claim other than c may still have a target
// published from c's staging, which NodeUnstageVolume must not pull from
// under it: a current claim published or lost (its reset comes first), or
// a past claim not yet unpublished.
func stagingHeld(v *persistence.Volume, c *persistence.Claim) bool {
	for i := range v.Claims {
		o := &v.Claims[i]
		if o.Alloc != c.Alloc && o.StagingPath == c.StagingPath && (o.State == StatePublished || o.State == StateLost) {
			return true
		}
	}
	for i := range v.PastClaims {
		o := &v.PastClaims[i]
		if o.StagingPath == c.StagingPath && o.State == StateTaken {
			return true
		}
	}
	return false
}

// ApplyPublish records in v (in place) that s, a step NextPublish returned,
// succeeded with r; it also clears the claim's last error.
func ApplyPublish(v *persistence.Volume, s Step, r Result, now time.Time) {
	i := FindClaim(v.Claims, s.Alloc)
	if i < 0 {
		return
	}
	c := &v.Claims[i]
	// Staging a staged claim again (see Unstaged) keeps the failure that
	// led to it: a NodePublishVolume that fails again backs off further.
	restaged := s.Method == NodeStage && c.State == StateStaged
	switch s.Method {
	case ControllerPublish:
		v.ControllerPublished = true
		v.PublishContext = maps.Clone(r.PublishContext)
		c.State = StateControllerPublished
	case NodeStage:
		addUser(v, s.Usage, s.StagingPath, s.Alloc)
		st := &v.Stagings[FindStaging(v, s.StagingPath)]
		st.Staged, st.Lost = true, false
		c.State = StateStaged
	case NodePublish:
		c.State = StatePublished
		c.Repair = ""
	case NodeUnpublish: // a lost claim's reset
		c.State = StateReserved
	case NodeUnstage: // a lost staging's reset
		if j := FindStaging(v, s.StagingPath); j >= 0 {
			v.Stagings[j].Lost = false
		}
	}
	if !restaged {
		c.LastError, c.Attempts = "", 0
	}
	c.UpdatedAt = now
}

// Unstaged records in v (in place) that alloc's current claim found its
// staging gone on the plugin (NodePublishVolume answered
// FailedPrecondition): the staging is marked unstaged, so that NextPublish
// stages it again before the next NodePublishVolume instead of retrying
// one that cannot succeed. The claim stays in its state, with its failure:
// a claim that keeps failing is not moving. A claim without a staging is
// left as it is.
func Unstaged(v *persistence.Volume, alloc string) {
	i := FindClaim(v.Claims, alloc)
	if i < 0 || v.Claims[i].StagingPath == "" {
		return
	}
	if j := FindStaging(v, v.Claims[i].StagingPath); j >= 0 {
		v.Stagings[j].Staged = false
	}
}

// DistrustTeardowns makes v (in place) trust nothing that a teardown under
// way may already have removed, when v is loaded after the agent or the
// volume actor stopped. A release's steps are not synced before their RPCs
// (see the volume actor's persistStep), so a crash can lose the mark that
// made a staging or an attachment uncertain while the plugin went on to
// unstage or unpublish it. A staging that a past claim still uses and no
// current claim does is marked unstaged, and so is the controller
// attachment while a past claim may unpublish it and no current claim
// holds it: a new claim then stages and publishes again (every CSI call is
// idempotent) instead of joining what may be gone.
//
// What a current claim holds needs no such care: claims are added and
// retired only by synced writes, so a staging or attachment that a current
// claim in the loaded record holds was never torn down after that record.
// It reports whether v changed.
func DistrustTeardowns(v *persistence.Volume) bool {
	changed := false
	for i := range v.PastClaims {
		p := &v.PastClaims[i]
		if p.State != StateTaken && p.State != StateNodeDetached {
			continue
		}
		if j := FindStaging(v, p.StagingPath); p.StagingPath != "" && j >= 0 && v.Stagings[j].Staged && !heldByClaim(v, j) {
			v.Stagings[j].Staged = false
			changed = true
		}
		if v.ControllerPublished && len(v.Claims) == 0 {
			// The past claim keeps the unpublish to do.
			v.ControllerPublished, v.PublishContext = false, nil
			p.ControllerRequired = true
			changed = true
		}
	}
	return changed
}

// heldByClaim reports whether a current claim of v uses staging j.
func heldByClaim(v *persistence.Volume, j int) bool {
	return slices.ContainsFunc(v.Stagings[j].Users, func(u string) bool { return FindClaim(v.Claims, u) >= 0 })
}

// RecordFailure sets the last error of alloc's claim in claims (current or
// past), counts the attempt, and returns the number of failed attempts.
func RecordFailure(claims []persistence.Claim, alloc string, msg string, now time.Time) int {
	i := FindClaim(claims, alloc)
	if i < 0 {
		return 0
	}
	c := &claims[i]
	c.LastError = msg
	c.Attempts++
	c.UpdatedAt = now
	return c.Attempts
}

// Retire moves alloc's current claim on v (in place) to the past claims in
// state taken, with lastError (empty for a release), and returns a copy of
// it; false when alloc holds no current claim.
func Retire(v *persistence.Volume, alloc, lastError string, now time.Time) (persistence.Claim, bool) {
	i := FindClaim(v.Claims, alloc)
	if i < 0 {
		return persistence.Claim{}, false
	}
	c := v.Claims[i]
	v.Claims = slices.Delete(v.Claims, i, i+1)
	c.State = StateTaken
	c.LastError = lastError
	c.Attempts = 0
	c.UpdatedAt = now
	v.PastClaims = append(v.PastClaims, c)
	return c, true
}

// AdvanceRelease moves alloc's past claim on v (in place) through every
// transition that needs no RPC, and returns the next RPC to run (run is
// true), or run false when the claim is freed (gone from v.PastClaims).
// changed reports whether v was modified.
//
// The release steps: taken → NodeUnpublishVolume (the claim then stops
// being a user of its staging) → NodeUnstageVolume when it was the last
// user → node-detached → ControllerUnpublishVolume when the volume is
// (or may be) published to this host and no other claim here still needs
// it → controller-detached → ready-to-free → freed.
//
// A step that tears down what other claims could share (the staging, the
// controller attachment) is recorded as undone before it runs: its outcome
// is uncertain until it answers, so a claim that arrives meanwhile does it
// again (both are idempotent) instead of trusting a staging or attachment
// that may be gone.
func AdvanceRelease(v *persistence.Volume, alloc string, now time.Time) (s Step, run, changed bool) {
	for {
		i := FindClaim(v.PastClaims, alloc)
		if i < 0 {
			return Step{}, false, changed
		}
		c := &v.PastClaims[i]
		set := func(state string) {
			c.State, c.LastError, c.Attempts, c.UpdatedAt = state, "", 0, now
			changed = true
		}
		switch c.State {
		case StateTaken:
			if c.StagingPath == "" {
				return stepFor(v, c, NodeUnpublish), true, changed
			}
			j := FindStaging(v, c.StagingPath)
			switch {
			case j >= 0 && slices.Contains(v.Stagings[j].Users, alloc):
				return stepFor(v, c, NodeUnpublish), true, changed
			case j >= 0 && len(v.Stagings[j].Users) == 0:
				// A staging being torn down is not one a new claim may
				// join as it is: from the moment NodeUnstageVolume may
				// have run (its outcome can be lost to a timeout or a
				// crash), the record says unstaged, persisted before the
				// call, so a claim that joins meanwhile stages again.
				if v.Stagings[j].Staged {
					v.Stagings[j].Staged = false
					changed = true
				}
				return stepFor(v, c, NodeUnstage), true, changed
			default:
				// Unpublished, and someone else still uses (or
				// already removed) the staging.
				set(StateNodeDetached)
			}
		case StateNodeDetached:
			if (v.ControllerPublished || c.ControllerRequired) && !controllerNeeded(v, alloc) {
				// The same for the attachment: once ControllerUnpublish
				// may have run, the volume is not known to be published
				// here, and the next claim publishes it again. This
				// claim keeps the unpublish to do (ControllerRequired)
				// until it succeeds.
				if v.ControllerPublished {
					v.ControllerPublished, v.PublishContext = false, nil
					c.ControllerRequired = true
					changed = true
				}
				return stepFor(v, c, ControllerUnpublish), true, changed
			}
			set(StateControllerDetached)
		case StateControllerDetached:
			set(StateReadyToFree)
		case StateReadyToFree:
			v.PastClaims = slices.Delete(v.PastClaims, i, i+1)
			changed = true
		default:
			// An unknown state (a newer agent wrote it?): start the
			// teardown over; every step is idempotent.
			set(StateTaken)
		}
	}
}

// controllerNeeded reports whether a claim other than alloc's still needs the
// volume published to this host: any current claim, or a past claim not yet
// detached from the node.
func controllerNeeded(v *persistence.Volume, alloc string) bool {
	if len(v.Claims) > 0 {
		return true
	}
	for i := range v.PastClaims {
		if v.PastClaims[i].Alloc != alloc && v.PastClaims[i].State == StateTaken {
			return true
		}
	}
	return false
}

// ApplyRelease records in v (in place) that s, a step AdvanceRelease
// returned, succeeded. Call AdvanceRelease next.
func ApplyRelease(v *persistence.Volume, s Step, now time.Time) {
	i := FindClaim(v.PastClaims, s.Alloc)
	if i < 0 {
		return
	}
	c := &v.PastClaims[i]
	c.LastError, c.Attempts, c.UpdatedAt = "", 0, now
	switch s.Method {
	case NodeUnpublish:
		if c.StagingPath == "" {
			c.State = StateNodeDetached
			return
		}
		if j := FindStaging(v, c.StagingPath); j >= 0 {
			st := &v.Stagings[j]
			st.Users = slices.DeleteFunc(st.Users, func(u string) bool { return u == s.Alloc })
		}
		// AdvanceRelease decides between unstaging and node-detached.
	case NodeUnstage:
		if j := FindStaging(v, c.StagingPath); j >= 0 && len(v.Stagings[j].Users) == 0 {
			v.Stagings = slices.Delete(v.Stagings, j, j+1)
		}
		c.State = StateNodeDetached
	case ControllerUnpublish:
		v.ControllerPublished = false
		v.PublishContext = nil
		c.State = StateControllerDetached
	}
}

// Unfinished reports whether v has a step to resume: a current claim not
// yet published, any past claim, or an expansion or modification in
// progress.
func Unfinished(v *persistence.Volume) bool {
	if len(v.PastClaims) > 0 || v.Expansion != nil || len(v.Modifying) > 0 {
		return true
	}
	for i := range v.Claims {
		if v.Claims[i].State != StatePublished {
			return true
		}
	}
	return false
}

// stepFor builds the request of method m for claim c of volume v. It shares
// v's maps: a record is never changed in place (see CloneVolume), and
// neither is a step.
func stepFor(v *persistence.Volume, c *persistence.Claim, m Method) Step {
	capab := CapabilityOf(v, c)
	s := Step{
		Method:        m,
		Plugin:        v.Plugin,
		Volume:        v.ID,
		Alloc:         c.Alloc,
		Usage:         c.Usage,
		ExternalID:    v.ExternalID,
		NodeID:        c.NodeID,
		Capability:    capab,
		StagingPath:   c.StagingPath,
		TargetPath:    c.TargetPath,
		VolumeContext: v.Context,
		Secrets:       v.Secrets,
		SecretsFrom:   v.SecretsFrom,
	}
	switch m {
	case ControllerPublish:
		s.Readonly = capab.AccessMode.ReadOnly()
	case NodePublish:
		s.Readonly = c.Mode == string(ModeRead) || capab.AccessMode.ReadOnly() || c.ReadOnly
		s.PublishContext = v.PublishContext
		s.Capability = withFlags(capab, optionsOf(v, c).MountFlags...)
		s.MountGroup = c.MountGroup
	case NodeStage:
		s.PublishContext = v.PublishContext
		s.MountGroup = c.MountGroup
	}
	if c.SELinuxContext != "" && (m == NodeStage || m == NodePublish) {
		s.Capability = withFlags(s.Capability, SELinuxMountFlag(c.SELinuxContext))
	}
	return s
}

// CapabilityOf returns claim c's capability on v: its access and attachment
// modes, with the volume's mount options for a file-system attachment.
func CapabilityOf(v *persistence.Volume, c *persistence.Claim) csi.VolumeCapability {
	// Both names were checked when the claim was admitted.
	vc, _ := csi.ParseVolumeCapability(c.AccessMode, c.AttachmentMode)
	if vc.AttachmentMode == csi.AttachmentModeFileSystem && v.MountOptions != nil {
		vc.MountOptions = &csi.MountOptions{FSType: v.MountOptions.FSType, MountFlags: v.MountOptions.MountFlags}
	}
	return vc
}

// CloneVolume returns a copy of v for the volume actor to change: it keeps
// every record it has persisted or published unchanged. The claims and
// stagings, which the plan functions change in place, are copied. The rest
// is shared: the definition (capabilities, mount options, parameters,
// context, secrets) never changes after registration, and the publish
// context is only ever replaced, never changed in place. Copying those maps
// at every step was most of what a step allocated.
func CloneVolume(v *persistence.Volume) *persistence.Volume {
	if v == nil {
		return nil
	}
	c := *v
	c.Claims = slices.Clone(v.Claims)
	c.PastClaims = slices.Clone(v.PastClaims)
	if v.Stagings != nil {
		c.Stagings = make([]persistence.Staging, len(v.Stagings))
		for i, st := range v.Stagings {
			st.Users = slices.Clone(st.Users)
			c.Stagings[i] = st
		}
	}
	return &c
}
