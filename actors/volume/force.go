package volume

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// Event types of the escape hatches, for an operator's audit trail.
const (
	// EventClaimForceReleased: a past claim was forgotten by a forced
	// release after one last best-effort teardown; the message names what
	// may be left on the host or the storage.
	EventClaimForceReleased = "claim-force-released"
	// EventVolumeForceDeregistered: a volume was forgotten by a forced
	// deregistration with past claims not freed; the message names them
	// and what may be left.
	EventVolumeForceDeregistered = "volume-force-deregistered"
)

// forceReleaseRequest is sent to a volume actor by Manager.ForceRelease.
// The reply comes when the past claim is forgotten.
type forceReleaseRequest struct {
	alloc string
	reply chan<- reply
}

// forceWork runs the last teardown of alloc's past claim when the slot is
// free.
type forceWork struct{ alloc string }

// forceFinished is sent to a volume actor by the goroutine that ran the
// last teardown of alloc's past claim: steps, each run once, and their
// results.
type forceFinished struct {
	owner   *volumeActor
	alloc   string
	steps   []claim.Step
	results []claim.Result
}

// ForceRelease forgets alloc's claim on the volume after one last
// best-effort teardown: each release RPC that remains (NodeUnpublishVolume,
// NodeUnstageVolume when it is the last user of its staging,
// ControllerUnpublishVolume when no other claim here needs the volume) is
// sent once, whatever the others answered, without waiting for the plugin
// to be healthy; then the past claim is removed from the record. It is
// the way out of a teardown that a broken plugin refuses forever.
//
// A current claim is released first (as Release does) and then forced at
// once: its RPCs are sent once too. The returned claim is in state
// claim.StateFreed; the returned list names what may be left (a target
// mount, a staging, a controller attachment), each with the error of its
// RPC, and so does the EventClaimForceReleased event. A staging that may be left
// stays in the record as not staged, so the next claim stages it again
// and a later release unstages it. A crash before the claim is forgotten
// leaves it a past claim, torn down as usual; force it again.
func (m *Manager) ForceRelease(ctx context.Context, volumeID, alloc string) (Claim, []string, error) {
	if err := claim.CheckName("volume", volumeID); err != nil {
		return Claim{}, nil, err
	}
	if err := claim.CheckName("alloc", alloc); err != nil {
		return Claim{}, nil, err
	}
	r, err := m.ask(ctx, volumeID, false, func(ch chan<- reply) any {
		return &forceReleaseRequest{alloc: alloc, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Claim{}, nil, err
	}
	return claimOf(volumeID, &r.claim), r.left, nil
}

// ForceDeregister forgets volume id even though it has past claims that
// are not freed: their teardown stops, and nothing is sent to the plugin.
// The EventVolumeForceDeregistered event names each past claim and what
// it may leave. A volume with current claims is still ErrInUse: release
// them (with ForceRelease if need be) first.
func (m *Manager) ForceDeregister(ctx context.Context, id string) ([]string, error) {
	if err := claim.CheckName("id", id); err != nil {
		return nil, err
	}
	r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
		return &deregisterRequest{ctx: ctx, force: true, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	return r.left, err
}

// forceRelease handles a forced release: a current claim is retired
// first; the past claim's claim actor is stopped and its last teardown
// queued.
func (a *volumeActor) forceRelease(ctx actor.Context, msg *forceReleaseRequest) {
	if a.rec == nil {
		answer(msg.reply, reply{err: a.notFound()})
		return
	}
	alloc := msg.alloc
	if claim.FindClaim(a.rec.Claims, alloc) >= 0 {
		v := claim.CloneVolume(a.rec)
		claim.Retire(v, alloc, "", time.Now())
		if err := a.persist(v, "release"); err != nil {
			answer(msg.reply, reply{err: err})
			return
		}
		a.endPublish(alloc, a.releasedEarly(alloc))
	}
	if claim.FindClaim(a.rec.PastClaims, alloc) < 0 {
		answer(msg.reply, reply{err: kinderr.Errorf(ErrNotFound, "alloc %q holds no claim on volume %q", alloc, a.h.id)})
		return
	}
	w := a.work(alloc)
	w.forcing = append(w.forcing, msg.reply)
	if len(w.forcing) > 1 {
		return
	}
	// The claim actor stops retrying; its Terminated frees a slot lent to
	// it, and is not answered with a new claim actor while forcing.
	if w.claimer != nil {
		ctx.Stop(w.claimer)
	}
	w.respawn.Stop()
	w.respawn = nil
	a.queue = slices.DeleteFunc(a.queue, func(w any) bool {
		t, ok := w.(*turnWork)
		return ok && t.alloc == alloc
	})
	a.queue = append(a.queue, &forceWork{alloc: alloc})
	a.settle(ctx)
}

// forcePlan returns the release RPCs that remain for alloc's past claim on
// v, in order, as the usual teardown would send them if each succeeded.
func forcePlan(v *persistence.Volume, alloc string, now time.Time) []claim.Step {
	sim := claim.CloneVolume(v)
	var steps []claim.Step
	for range 8 { // at most three RPCs; bounded against a plan that loops
		s, run, _ := claim.AdvanceRelease(sim, alloc, now)
		if !run {
			break
		}
		steps = append(steps, s)
		claim.ApplyRelease(sim, s, now)
	}
	return steps
}

// runForce starts the last teardown of alloc's past claim. The slot is
// free. Before the first RPC the record says what the teardown may undo:
// a staging it unstages is no longer staged, and the volume is no longer
// controller-published once ControllerUnpublishVolume may run, so a claim
// that arrives meanwhile stages and publishes again (both idempotent).
func (a *volumeActor) runForce(ctx actor.Context, alloc string) {
	if a.rec == nil || claim.FindClaim(a.rec.PastClaims, alloc) < 0 {
		a.answerForced(alloc, reply{claim: persistence.Claim{Alloc: alloc, State: claim.StateFreed}, vol: a.rec})
		return
	}
	now := time.Now()
	steps := forcePlan(a.rec, alloc, now)
	v := claim.CloneVolume(a.rec)
	c := &v.PastClaims[claim.FindClaim(v.PastClaims, alloc)]
	for _, s := range steps {
		switch s.Method {
		case claim.NodeUnstage:
			if j := claim.FindStaging(v, s.StagingPath); j >= 0 {
				v.Stagings[j].Staged = false
			}
		case claim.ControllerUnpublish:
			if v.ControllerPublished {
				v.ControllerPublished, v.PublishContext = false, nil
				c.ControllerRequired = true
			}
		}
	}
	c.LastError = "forced release: last teardown in progress"
	c.UpdatedAt = now
	a.mustPersist(v, "force")
	a.log.WithFields(logrus.Fields{"alloc": alloc, "rpcs": len(steps)}).
		Warn("forced release: sending each remaining teardown RPC once, then forgetting the claim")
	runner := a.m.runner
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		results := make([]claim.Result, len(steps))
		for i, s := range steps {
			results[i] = runner.Run(jctx, s)
		}
		return &forceFinished{owner: a, alloc: alloc, steps: steps, results: results}
	})
}

// forceFinished forgets the past claim whose last teardown ran, and
// reports what may be left.
func (a *volumeActor) forceFinished(ctx actor.Context, msg *forceFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	defer a.settle(ctx)
	alloc := msg.alloc
	i := -1
	if a.rec != nil {
		i = claim.FindClaim(a.rec.PastClaims, alloc)
	}
	if i < 0 {
		a.answerForced(alloc, reply{claim: persistence.Claim{Alloc: alloc, State: claim.StateFreed}, vol: a.rec})
		return
	}
	v := claim.CloneVolume(a.rec)
	c := v.PastClaims[i]
	var left []string
	unstaged := false
	for k, s := range msg.steps {
		res := msg.results[k]
		if res.OK() {
			unstaged = unstaged || s.Method == claim.NodeUnstage
			continue
		}
		why := res.Err.Error()
		if !strings.HasPrefix(why, s.Method.String()) {
			why = s.Method.String() + ": " + why
		}
		left = append(left, leftBy(s, &c)+" ("+why+")")
	}
	if j := claim.FindStaging(v, c.StagingPath); c.StagingPath != "" && j >= 0 {
		st := &v.Stagings[j]
		st.Users = slices.DeleteFunc(st.Users, func(u string) bool { return u == alloc })
		if len(st.Users) == 0 && unstaged {
			v.Stagings = slices.Delete(v.Stagings, j, j+1)
		}
	}
	v.PastClaims = slices.Delete(v.PastClaims, i, i+1)
	a.forgetting = []string{alloc}
	err := a.persist(v, "force-release")
	a.forgetting = nil
	if err != nil {
		a.answerForced(alloc, reply{err: err})
		return
	}
	msgText := "claim forgotten by a forced release; its last teardown finished, nothing is left"
	if len(left) > 0 {
		msgText = "claim forgotten by a forced release; may be left: " + strings.Join(left, "; ")
	}
	a.log.WithFields(logrus.Fields{"alloc": alloc, "left": len(left)}).Warn(msgText)
	a.m.emit(a.rec, EventClaimForceReleased, alloc, msgText)
	c.State = claim.StateFreed
	c.LastError = strings.Join(left, "; ")
	a.answerForced(alloc, reply{vol: a.rec, claim: c, left: left})
}

// leftBy names what the failed step s of past claim c may leave.
func leftBy(s claim.Step, c *persistence.Claim) string {
	switch s.Method {
	case claim.NodeUnpublish:
		return "target mount " + c.TargetPath
	case claim.NodeUnstage:
		return "staging " + c.StagingPath
	case claim.ControllerUnpublish:
		return "controller attachment to node " + orUnknown(c.NodeID)
	}
	return s.Method.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// leftovers names what past claim c of v may leave if it is forgotten as
// it is, from its state.
func leftovers(v *persistence.Volume, c *persistence.Claim) []string {
	var out []string
	if c.State == claim.StateTaken {
		j := -1
		if c.StagingPath != "" {
			j = claim.FindStaging(v, c.StagingPath)
		}
		if c.StagingPath == "" || (j >= 0 && slices.Contains(v.Stagings[j].Users, c.Alloc)) {
			out = append(out, "target mount "+c.TargetPath)
		}
		if j >= 0 && len(slices.DeleteFunc(slices.Clone(v.Stagings[j].Users), func(u string) bool { return u == c.Alloc })) == 0 {
			out = append(out, "staging "+c.StagingPath)
		}
	}
	if (c.State == claim.StateTaken || c.State == claim.StateNodeDetached) && (v.ControllerPublished || c.ControllerRequired) {
		out = append(out, "controller attachment to node "+orUnknown(c.NodeID))
	}
	return out
}

func (a *volumeActor) answerForced(alloc string, r reply) {
	if w := a.allocs[alloc]; w != nil {
		answerAll(w.forcing, r)
		w.forcing = nil
		a.tidy(alloc)
	}
}

// forceDeregister forgets the volume with its past claims (force set on
// a Deregister). The slot is free.
func (a *volumeActor) forceDeregister(ctx actor.Context, req *deregisterRequest) {
	var what, left []string
	for i := range a.rec.PastClaims {
		c := &a.rec.PastClaims[i]
		l := leftovers(a.rec, c)
		left = append(left, l...)
		s := fmt.Sprintf("alloc %q (%s", c.Alloc, c.State)
		if len(l) > 0 {
			s += "; may be left: " + strings.Join(l, ", ")
		}
		what = append(what, s+")")
	}
	msg := fmt.Sprintf("volume deregistered by force with %s: %s", claimsHeld(0, len(a.rec.PastClaims)), strings.Join(what, "; "))
	a.log.WithField("past_claims", len(a.rec.PastClaims)).Warn(msg)
	rec := a.rec
	a.freeHosts(rec, nil) // the cluster forgets them too
	req.left = left
	a.remove(ctx, req)
	if a.rec == nil {
		a.m.emit(rec, EventVolumeForceDeregistered, "", msg)
	}
}

// emit reports an event of volume v.
func (m *Manager) emit(v *persistence.Volume, typ, alloc, msg string) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: typ, Plugin: v.Plugin, Volume: v.ID, Alloc: alloc, Message: msg})
}

// inUseHint is what a refused deregistration suggests: release the
// claims, and for past claims that are not freed, force.
func inUseHint(claims, past int, force bool) string {
	switch {
	case claims > 0 && force:
		return "; force forgets past claims only: release the claims first (with force if their teardown is stuck)"
	case claims > 0:
		return "; release them first"
	case past > 0:
		return "; wait for them to be freed, or deregister with force to forget them"
	}
	return ""
}
