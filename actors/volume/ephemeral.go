package volume

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// An ephemeral volume is one a claim creates for itself (ClaimEphemeral)
// and that is deleted through the controller once its last claim is freed.
// Its record goes through three phases (persistence.Volume.Ephemeral),
// each written durably before the RPC it leads to:
//
//   - creating: the intent (plugin, capabilities, parameters, capacity,
//     the topology asked for) is recorded before CreateVolume, which is
//     idempotent by name (the volume ID), so a crash before the answer is
//     recorded sends it again after the restart;
//   - ready: CreateVolume's answer is recorded before the claim is
//     reserved and published; from here the volume is claimed and
//     released like any other;
//   - deleting: recorded once no claim nor past claim is left, before
//     DeleteVolume; the record is removed when DeleteVolume succeeds
//     (NotFound counts as success), and a restart in between deletes it
//     again.
//
// The volume actor drives these steps whenever its slot is free (see
// driveEphemeral): a crash at any point leaves a record that the next
// start resumes, so the plugin never keeps a volume the agent does not
// know, and nothing is deleted while a claim holds it. A created volume
// no claim ended up holding (its claim failed, or its caller went away
// during a crash) is deleted the same way.

// ephemeralRequest is sent to a volume actor by Manager.ClaimEphemeral:
// claim the volume, after creating it as an ephemeral volume from spec
// when it is not registered. It waits in the actor's queue for the slot.
type ephemeralRequest struct {
	spec  Spec
	claim claimRequest
}

// ephemeralOp is the req of the opFinished of an ephemeral volume's
// CreateVolume (create set; out is the *csipb.Volume) or DeleteVolume.
type ephemeralOp struct{ create bool }

// ephemeralRetryDue is sent to a volume actor by the goroutine that waited
// out the backoff of an ephemeral volume's failed CreateVolume or
// DeleteVolume.
type ephemeralRetryDue struct{ owner *volumeActor }

// ephemeralWork is what a volume actor has in flight for its ephemeral
// volume beside its record.
type ephemeralWork struct {
	// waiters are the claims waiting for CreateVolume; they are reserved
	// when it has answered.
	waiters []*claimRequest
	// retry waits out the backoff of a failed CreateVolume or
	// DeleteVolume; attempts counts the failures in a row.
	retry    *claim.Job
	attempts int
	// recreate are the ephemeral claims that came while the volume is
	// being deleted. They are never answered here: once the volume is
	// gone this actor stops, and their callers send them again to the
	// next actor of the volume (Manager.ask), which creates it anew.
	recreate []*ephemeralRequest
}

// ClaimEphemeral claims volume req.VolumeID as Claim does. When no volume
// of that ID is registered, it is first created through spec.Plugin's
// controller from spec (its ID is req.VolumeID; ExternalID, CloneOf and
// FromSnapshot must be empty) and marked ephemeral: it is deleted through
// the controller once its last claim is freed. Each step is recorded
// before the RPC it leads to and resumed after a crash (see the comment at
// the top of ephemeral.go).
//
// The claim's access and attachment modes must be one of spec's
// capabilities (ErrInvalid otherwise). On a registered volume that is not
// ephemeral, or an ephemeral one of another plugin, or one being deleted,
// it fails with ErrConflict naming the volume; on an ephemeral volume it
// is a claim like any other (several claims may share the volume when its
// access mode allows), and spec is not compared with the volume's. On an
// ephemeral volume being deleted, it waits for the deletion to end and
// then creates the volume anew (a plain Claim is ErrConflict then).
func (m *Manager) ClaimEphemeral(ctx context.Context, req ClaimRequest, spec Spec) (Claim, error) {
	if err := req.validate(); err != nil {
		return Claim{}, err
	}
	spec.ID = req.VolumeID
	if spec.CloneOf != "" || spec.FromSnapshot != "" {
		return Claim{}, kinderr.Errorf(ErrInvalid, "ephemeral: an ephemeral volume is created empty (no clone or snapshot source)")
	}
	if err := spec.validate(true); err != nil {
		return Claim{}, kinderr.Errorf(ErrInvalid, "ephemeral: %w", err)
	}
	want := req.claim().Capability
	if !slices.ContainsFunc(spec.Capabilities, func(c csi.VolumeCapability) bool {
		return c.AccessMode == want.AccessMode && c.AttachmentMode == want.AttachmentMode
	}) {
		return Claim{}, kinderr.Errorf(ErrInvalid, "ephemeral: capabilities do not include the claim's access mode %s with attachment mode %s",
			want.AccessMode, want.AttachmentMode)
	}
	spec, err := m.placeCreate(ctx, spec)
	if err != nil {
		return Claim{}, err
	}
	r, err := m.ask(ctx, req.VolumeID, true, func(ch chan<- reply) any {
		return &ephemeralRequest{spec: spec, claim: claimRequest{req: req.claim(), reply: ch}}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Claim{}, err
	}
	return claimOf(req.VolumeID, &r.claim), nil
}

// ephemeral handles an ephemeralRequest. The slot is free.
func (a *volumeActor) ephemeral(ctx actor.Context, req *ephemeralRequest) {
	if a.rec == nil {
		v := req.spec.record(time.Now())
		v.Ephemeral = persistence.EphemeralCreating
		// The topology asked for, until CreateVolume answers with the
		// one the volume has: a CreateVolume resumed after a crash asks
		// for the same.
		v.AccessibleTopology = cloneTopology(req.spec.Topology)
		if err := a.persist(v, "ephemeral-intent"); err != nil {
			answer(req.claim.reply, reply{err: err})
			return
		}
		a.m.registered(a.h.id, a.rec)
		a.eph.waiters = append(a.eph.waiters, &req.claim)
		return // settle starts CreateVolume (driveEphemeral)
	}
	switch {
	case a.rec.Ephemeral == "":
		answer(req.claim.reply, reply{err: kinderr.Errorf(ErrConflict,
			"volume %q is registered and not ephemeral: claim it without ephemeral, or give the ephemeral volume another ID", a.h.id)})
	case a.rec.Ephemeral == persistence.EphemeralDeleting:
		a.eph.recreate = append(a.eph.recreate, req)
	case a.rec.Plugin != req.spec.Plugin:
		answer(req.claim.reply, reply{err: kinderr.Errorf(ErrConflict,
			"ephemeral volume %q is a volume of plugin %q, not of plugin %q", a.h.id, a.rec.Plugin, req.spec.Plugin)})
	default:
		a.claim(ctx, &req.claim)
	}
}

// ephemeralClaim handles a claim of a.rec while it is an ephemeral volume
// being created (the claim waits for it) or deleted (ErrConflict). It
// returns false, having done nothing, for any other volume.
func (a *volumeActor) ephemeralClaim(msg *claimRequest) bool {
	switch a.rec.Ephemeral {
	case persistence.EphemeralCreating:
		a.eph.waiters = append(a.eph.waiters, msg)
		return true
	case persistence.EphemeralDeleting:
		answer(msg.reply, reply{err: kinderr.Errorf(ErrConflict,
			"ephemeral volume %q is being deleted (its last claim was freed); claim it again once it is gone", a.h.id)})
		return true
	}
	return false
}

// ephemeralPending reports whether v is an ephemeral volume with a step
// left to drive: its creation, or its deletion (which starts once it has
// no claim nor past claim).
func ephemeralPending(v *persistence.Volume) bool {
	switch v.Ephemeral {
	case persistence.EphemeralCreating, persistence.EphemeralDeleting:
		return true
	case persistence.EphemeralReady:
		return len(v.Claims) == 0 && len(v.PastClaims) == 0
	}
	return false
}

// driveEphemeral starts the next step of an ephemeral volume when the slot
// is free and nothing else waits for it: CreateVolume while it is being
// created, DeleteVolume once nothing holds it (recording the deletion
// first), or while it is being deleted.
func (a *volumeActor) driveEphemeral(ctx actor.Context) {
	v := a.rec
	if v == nil || a.stopping || a.eph.retry != nil || a.slot.kind != slotFree || len(a.queue) > 0 || !ephemeralPending(v) {
		return
	}
	if v.Ephemeral == persistence.EphemeralCreating {
		creq := specOfRecord(v).createRequest()
		a.startOp(ctx, &ephemeralOp{create: true}, context.Background(), v.Plugin, "CreateVolume", csi.PublishKind, true,
			func(ctx context.Context, c csi.Client) (any, error) {
				resp, err := c.CreateVolume(ctx, creq)
				return resp.GetVolume(), err
			})
		return
	}
	if v.Ephemeral == persistence.EphemeralReady {
		if len(a.allocs) > 0 || len(a.eph.waiters) > 0 || v.Expansion != nil {
			return // a claim is on its way, or a past claim's actor is still stopping
		}
		d := claim.CloneVolume(v)
		d.Ephemeral = persistence.EphemeralDeleting
		a.mustPersist(d, "ephemeral-deleting")
		a.log.Info("ephemeral volume has no claim left; deleting it through the controller")
	}
	dreq := &csipb.DeleteVolumeRequest{VolumeId: a.rec.ExternalID, Secrets: maps.Clone(a.rec.Secrets)}
	a.startOp(ctx, &ephemeralOp{}, context.Background(), a.rec.Plugin, "DeleteVolume", csi.UnpublishKind, true,
		func(ctx context.Context, c csi.Client) (any, error) { return nil, c.DeleteVolume(ctx, dreq) })
}

// ephemeralFinished handles the end of an ephemeral volume's CreateVolume
// or DeleteVolume. The slot has been vacated.
func (a *volumeActor) ephemeralFinished(ctx actor.Context, op *ephemeralOp, msg *opFinished) {
	if a.rec == nil {
		return
	}
	method := "DeleteVolume"
	if op.create {
		method = "CreateVolume"
	}
	res := msg.res
	created, _ := msg.out.(*csipb.Volume)
	if op.create && res.OK() && created.GetVolumeId() == "" {
		res = claim.Result{Outcome: csi.Final, Err: kinderr.Errorf(ErrPluginCall, "%w: no volume id", csi.ErrInvalidResponse)}
	}
	switch {
	case res.OK() && op.create:
		a.eph.attempts = 0
		v := claim.CloneVolume(a.rec)
		v.Context = maps.Clone(v.Context) // applyCreated adds to it
		applyCreated(v, created)
		v.Ephemeral = persistence.EphemeralReady
		if err := a.m.takeExt(keyOf(v), a.h.id); err != nil {
			// The plugin answered with a volume registered under
			// another ID: it is that ID's, and left alone.
			a.answerEphemeral(reply{err: err})
			a.dropEphemeral(ctx, false)
			return
		}
		a.mustPersist(v, "ephemeral-created")
		a.log.WithField("external_id", v.ExternalID).Info("ephemeral volume created through the controller")
		waiters := a.eph.waiters
		a.eph.waiters = nil
		for _, w := range waiters {
			a.claim(ctx, w)
		}
	case res.OK():
		a.dropEphemeral(ctx, true)
	case op.create && res.Outcome == csi.Final && !res.Unavailable:
		// The plugin refused: it created nothing.
		err := opError(method, a.h.id, res)
		a.log.WithError(err).Error("ephemeral volume could not be created; forgetting it")
		a.answerEphemeral(reply{err: err})
		a.dropEphemeral(ctx, false)
	default:
		// Unavailable (no controller to ask), or a deletion the plugin
		// refused: the record stays and the step is retried.
		err := opError(method, a.h.id, res)
		if res.Unavailable {
			err = kinderr.Errorf(ErrPluginUnavailable, "%w", err)
		}
		a.answerEphemeral(reply{err: err})
		a.eph.attempts++
		delay := a.m.cfg.Backoff.Delay(a.eph.attempts - 1)
		a.log.WithError(err).WithFields(logrus.Fields{"method": method, "attempt": a.eph.attempts, "delay": delay}).
			Warn("ephemeral volume step failed; retrying with backoff")
		a.eph.retry = a.pauseThen(ctx, a.rec.Plugin, claim.ControllerPlugin, delay, &ephemeralRetryDue{owner: a})
	}
}

// answerEphemeral answers the claims waiting for CreateVolume with r.
func (a *volumeActor) answerEphemeral(r reply) {
	for _, w := range a.eph.waiters {
		answer(w.reply, r)
	}
	a.eph.waiters = nil
}

// dropEphemeral removes the ephemeral volume's record: deleted through
// the controller, or never created. A store failure crashes the actor,
// which reloads the record and does the step again.
func (a *volumeActor) dropEphemeral(ctx actor.Context, deleted bool) {
	if err := a.forget(ctx, deleted, "ephemeral-forget"); err != nil {
		panic(err)
	}
}

func (a *volumeActor) ephemeralRetryDue(ctx actor.Context, msg *ephemeralRetryDue) {
	if msg.owner != a || a.eph.retry == nil {
		return
	}
	a.eph.retry.Stop()
	a.eph.retry = nil
	a.settle(ctx)
}

// specOfRecord is the definition a record of a volume holds, with the
// topology it asks for: its accessible topology.
func specOfRecord(v *persistence.Volume) Spec {
	s := Spec{
		ID: v.ID, Plugin: v.Plugin, ExternalID: v.ExternalID,
		Parameters: v.Parameters, Context: v.Context, Secrets: v.Secrets,
		CapacityBytes: v.CapacityBytes, Topology: v.AccessibleTopology,
	}
	for _, c := range v.Capabilities {
		// Checked when the volume was registered.
		vc, _ := csi.ParseVolumeCapability(c.AccessMode, c.AttachmentMode)
		s.Capabilities = append(s.Capabilities, vc)
	}
	if mo := v.MountOptions; mo != nil {
		s.MountOptions = &csi.MountOptions{FSType: mo.FSType, MountFlags: mo.MountFlags}
	}
	return s
}
