package volume

import (
	"fmt"
	"slices"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// Event types the manager reports through Config.OnEvent. The strings are
// the ones the agent's event stream uses.
const (
	EventVolumeRegistered   = "volume-registered"
	EventVolumeCreated      = "volume-created"
	EventVolumeDeregistered = "volume-deregistered"
	// EventVolumeDeleted replaces EventVolumeDeregistered when the volume
	// was deleted through the controller (Manager.Delete) and then
	// deregistered.
	EventVolumeDeleted  = "volume-deleted"
	EventClaimPublished = "claim-published"
	EventClaimReleased  = "claim-released"
	EventClaimFreed     = "claim-freed"
	EventClaimFailed    = "claim-failed"
	// EventClaimStep: a claim reached a step short of published (reserved,
	// controller-published, staged); the message names the step.
	EventClaimStep = "claim-step"
	// EventClaimRetrying: a claim's step failed and is retried with
	// backoff; the message has the attempt and the error (which names the
	// RPC).
	EventClaimRetrying = "claim-retrying"
	// EventClaimRepaired replaces EventClaimPublished when a claim is
	// published again because the host was missing its volume; the
	// message names what was missing.
	EventClaimRepaired = "claim-repaired"
	// EventVolumeExpanding: an expansion was recorded and its first step
	// starts; EventVolumeExpanded: it is done (the message says the new
	// capacity); EventVolumeExpandFailed: the plugin refused it for good.
	EventVolumeExpanding    = "volume-expanding"
	EventVolumeExpanded     = "volume-expanded"
	EventVolumeExpandFailed = "volume-expand-failed"
	// EventVolumeModifying: a modification was recorded and its
	// ControllerModifyVolume starts; EventVolumeModified: it is done;
	// EventVolumeModifyFailed: the plugin refused it for good. The
	// messages name the mutable parameters, never their values.
	EventVolumeModifying    = "volume-modifying"
	EventVolumeModified     = "volume-modified"
	EventVolumeModifyFailed = "volume-modify-failed"
)

// Event is something that happened to a volume, reported to Config.OnEvent
// after it was persisted. Message never holds secrets or mount flags.
type Event struct {
	Time    time.Time
	Type    string
	Plugin  string
	Volume  string
	Alloc   string
	Message string
}

// recordEvents reports what changed between the persisted records old and
// cur (old is nil for a new volume). It runs on the volume actor, after the
// write, and must not block: OnEvent is documented as non-blocking.
//
// forgotten are allocs whose past claims cur drops without their being
// freed (a forced release): no claim-freed event for them.
func (m *Manager) recordEvents(old, cur *persistence.Volume, forgotten ...string) {
	emit := m.cfg.OnEvent
	if emit == nil || cur == nil {
		return
	}
	now := time.Now()
	ev := func(typ, alloc, msg string) {
		emit(Event{Time: now, Type: typ, Plugin: cur.Plugin, Volume: cur.ID, Alloc: alloc, Message: msg})
	}
	switch {
	case old == nil && cur.Ephemeral == persistence.EphemeralCreating:
		// The intent of an ephemeral volume: EventVolumeCreated comes
		// when CreateVolume has answered.
		old = &persistence.Volume{}
	case old != nil && old.Ephemeral == persistence.EphemeralCreating && cur.Ephemeral == persistence.EphemeralReady:
		ev(EventVolumeCreated, "", "ephemeral volume created through the controller")
	case old == nil:
		if cur.Created {
			ev(EventVolumeCreated, "", "volume created through the controller")
		} else {
			ev(EventVolumeRegistered, "", "volume registered")
		}
		old = &persistence.Volume{}
	default:
		recordExpansion(old, cur, ev)
		recordModification(old, cur, ev)
	}
	oldClaims, oldPast, curPast := indexClaims(old.Claims), indexClaims(old.PastClaims), indexClaims(cur.PastClaims)
	for _, c := range cur.Claims {
		i := oldClaims.find(c.Alloc)
		if c.State != claim.StatePublished {
			recordStep(c, oldClaims, i, ev)
			continue
		}
		switch {
		case i >= 0 && oldClaims.claims[i].State == claim.StatePublished:
		case i >= 0 && oldClaims.claims[i].Repair != "":
			ev(EventClaimRepaired, c.Alloc, repairMessage(oldClaims.claims[i].Repair)+"; published again at "+c.TargetPath)
		default:
			ev(EventClaimPublished, c.Alloc, c.Mode+" claim published at "+c.TargetPath)
		}
	}
	for _, c := range cur.PastClaims {
		if oldPast.find(c.Alloc) >= 0 {
			continue
		}
		if prev := oldClaims.state(c.Alloc); prev != "" && prev != claim.StatePublished {
			msg := "claim failed in state " + prev + "; tearing down"
			if c.LastError != "" {
				msg += ": " + c.LastError
			}
			ev(EventClaimFailed, c.Alloc, msg)
		} else {
			ev(EventClaimReleased, c.Alloc, "claim released; tearing down")
		}
	}
	for _, c := range old.PastClaims {
		if curPast.find(c.Alloc) < 0 && !slices.Contains(forgotten, c.Alloc) {
			ev(EventClaimFreed, c.Alloc, "past claim freed")
		}
	}
}

// recordStep reports a claim short of published that reached a new step
// (or was just reserved), or whose step failed again; i is its index in
// old, or -1.
func recordStep(c persistence.Claim, old claimIndex, i int, ev func(typ, alloc, msg string)) {
	switch {
	case i < 0:
		ev(EventClaimStep, c.Alloc, fmt.Sprintf("%s claim %s (%s/%s)", c.Mode, c.State, c.AccessMode, c.AttachmentMode))
	case old.claims[i].State != c.State:
		ev(EventClaimStep, c.Alloc, c.State)
	case c.Attempts > old.claims[i].Attempts && c.LastError != "":
		ev(EventClaimRetrying, c.Alloc, fmt.Sprintf("attempt %d failed, retrying: %s", c.Attempts, c.LastError))
	}
}

// recordExpansion reports the start and the end of an expansion.
func recordExpansion(old, cur *persistence.Volume, ev func(typ, alloc, msg string)) {
	if old.Expansion == nil && cur.Expansion != nil {
		ev(EventVolumeExpanding, "", fmt.Sprintf("expanding from %d to %d bytes", old.CapacityBytes, cur.Expansion.CapacityBytes))
	}
	if old.Expansion != nil && cur.Expansion == nil && cur.CapacityBytes >= old.Expansion.CapacityBytes {
		ev(EventVolumeExpanded, "", fmt.Sprintf("expanded to %d bytes", cur.CapacityBytes))
	}
}

// recordModification reports the start and the successful end of a
// modification.
func recordModification(old, cur *persistence.Volume, ev func(typ, alloc, msg string)) {
	switch {
	case len(old.Modifying) == 0 && len(cur.Modifying) > 0:
		ev(EventVolumeModifying, "", "modifying mutable parameters "+paramNames(cur.Modifying))
	case len(old.Modifying) > 0 && len(cur.Modifying) == 0 && applied(cur.MutableParameters, old.Modifying):
		ev(EventVolumeModified, "", "modified mutable parameters "+paramNames(old.Modifying))
	}
}

// recordModifyFailed reports a modification the plugin refused for good.
func (m *Manager) recordModifyFailed(v *persistence.Volume, err error) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: EventVolumeModifyFailed, Plugin: v.Plugin, Volume: v.ID, Message: err.Error()})
}

// recordExpandFailed reports an expansion the plugin refused for good.
func (m *Manager) recordExpandFailed(v *persistence.Volume, err error) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: EventVolumeExpandFailed, Plugin: v.Plugin, Volume: v.ID, Message: err.Error()})
}

// claimIndex finds claims by alloc: by scanning when there are few, as in
// almost every record (no allocation at each persisted step), through a map
// when there are many.
type claimIndex struct {
	claims []persistence.Claim
	byID   map[string]int
}

func indexClaims(claims []persistence.Claim) claimIndex {
	x := claimIndex{claims: claims}
	if len(claims) > 16 {
		x.byID = make(map[string]int, len(claims))
		for i := range claims {
			x.byID[claims[i].Alloc] = i
		}
	}
	return x
}

func (x claimIndex) find(alloc string) int {
	if x.byID == nil {
		return claim.FindClaim(x.claims, alloc)
	}
	if i, ok := x.byID[alloc]; ok {
		return i
	}
	return -1
}

// state returns the state of alloc's claim, "" when it has none.
func (x claimIndex) state(alloc string) string {
	if i := x.find(alloc); i >= 0 {
		return x.claims[i].State
	}
	return ""
}

// recordRemoved reports a deregistered volume; deleted says it was deleted
// through the controller first.
func (m *Manager) recordRemoved(v *persistence.Volume, deleted bool) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	typ, msg := EventVolumeDeregistered, "volume deregistered"
	switch {
	case deleted && v.Ephemeral != "":
		typ, msg = EventVolumeDeleted, "ephemeral volume deleted through the controller: its last claim was freed"
	case deleted:
		typ, msg = EventVolumeDeleted, "volume deleted through the controller and deregistered"
	case v.Ephemeral != "":
		msg = "ephemeral volume forgotten: CreateVolume failed"
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: typ, Plugin: v.Plugin, Volume: v.ID, Message: msg})
}

// repairMessage says what a repair (persistence.Claim.Repair) was about.
func repairMessage(what string) string {
	if what == claim.RepairBootID {
		return "host rebooted (boot ID changed): every mount was gone"
	}
	if claim.BrokenCause(what) != "" {
		return what
	}
	if what == claim.RepairStagingAndTarget {
		return what + " were not mounted"
	}
	return what + " was not mounted"
}
