package volume

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/secretfile"
	"github.com/csiactor/csiactor/persistence"
)

// Expansion steps, as the fault points name them: "expand" (the intent,
// before the first RPC), "expand-controller" (ControllerExpandVolume
// done), "expand-node" (NodeExpandVolume done on every published claim)
// and "expand-failed" (given up, the intent removed).

// Expansion is a volume's expansion in progress.
type Expansion struct {
	// CapacityBytes is the capacity asked for.
	CapacityBytes int64 `json:"capacity_bytes"`
	// Step is the RPC that runs or is retried: "ControllerExpandVolume" or
	// "NodeExpandVolume".
	Step string `json:"step"`
}

func expansionOf(x *persistence.Expansion) *Expansion {
	if x == nil {
		return nil
	}
	step := "NodeExpandVolume"
	if x.Controller {
		step = "ControllerExpandVolume"
	}
	return &Expansion{CapacityBytes: x.CapacityBytes, Step: step}
}

// expandRequest is sent to a volume actor by Manager.Expand. facts are the
// plugin's expansion facts, looked up by the caller. The reply comes when
// the expansion is done or has failed for good.
type expandRequest struct {
	capacity int64
	facts    claim.Facts
	reply    chan<- reply
}

// expandWork resumes the persisted expansion of a restarted actor.
type expandWork struct{}

// expandFinished is sent to a volume actor by the goroutine that ran one
// expansion step: ControllerExpandVolume (node unset; resp is its answer)
// or NodeExpandVolume on every published claim (node set).
type expandFinished struct {
	owner *volumeActor
	node  bool
	res   claim.Result
	resp  *csipb.ControllerExpandVolumeResponse
	// retry: the step failed in a way that is retried (res says how).
	retry bool
}

// expandRetryDue is sent to a volume actor when the backoff of a failed
// expansion step has passed (and the plugin is healthy).
type expandRetryDue struct{ owner *volumeActor }

// Expand grows volume id to capacity bytes: ControllerExpandVolume when
// the controller has EXPAND_VOLUME, then NodeExpandVolume on the target
// path of every published claim when the controller says the node must
// expand too (or the plugin expands on the node only). The expansion is
// persisted before its first RPC and resumed after a crash; it returns
// when it is done, with the volume's new capacity.
//
// It fails with ErrInvalid for a capacity below the volume's (shrinking)
// or a plugin that cannot expand (no EXPAND_VOLUME capability), with
// ErrConflict while the volume is claimed and the plugin expands only
// offline, or while an expansion to another capacity is in progress, and
// with ErrPluginCall (wrapping the plugin's error) when the plugin refuses
// it. Asking again for the capacity of an expansion in progress waits for
// it; asking for the capacity the volume has returns at once.
func (m *Manager) Expand(ctx context.Context, id string, capacity int64) (Volume, error) {
	if err := claim.CheckName("id", id); err != nil {
		return Volume{}, err
	}
	if capacity <= 0 {
		return Volume{}, kinderr.Errorf(ErrInvalid, "capacity_bytes must be positive, not %d", capacity)
	}
	v, err := m.Get(ctx, id)
	if err != nil {
		return Volume{}, err
	}
	facts, err := m.expansionFacts(ctx, v.Plugin)
	if err != nil {
		return Volume{}, err
	}
	r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
		return &expandRequest{capacity: capacity, facts: facts, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Volume{}, err
	}
	return viewOf(r.vol), nil
}

// expansionFacts asks the registry what plugin can expand: the node
// plugin's facts (with the plugin's capabilities), and the controller's
// EXPAND_VOLUME when the plugin has a controller service.
func (m *Manager) expansionFacts(ctx context.Context, plugin string) (claim.Facts, error) {
	_, facts, nerr := m.plugins.Client(ctx, plugin, claim.NodePlugin)
	if nerr == nil && !facts.ControllerService {
		return facts, nil
	}
	_, cf, cerr := m.plugins.Client(ctx, plugin, claim.ControllerPlugin)
	switch {
	case cerr != nil && nerr != nil:
		return claim.Facts{}, kinderr.Errorf(ErrPluginUnavailable, "plugin %q: %w", plugin, nerr)
	case cerr != nil:
		return claim.Facts{}, kinderr.Errorf(ErrPluginUnavailable, "plugin %q (controller): %w", plugin, cerr)
	case nerr != nil:
		// No node plugin here: the controller expands alone.
		cf.NodeExpand = false
		return cf, nil
	}
	facts.ControllerExpand = cf.ControllerExpand
	return facts, nil
}

// expand handles an expansion request. The slot is free.
func (a *volumeActor) expand(ctx actor.Context, req *expandRequest) {
	if a.rec == nil {
		answer(req.reply, reply{err: a.notFound()})
		return
	}
	if x := a.rec.Expansion; x != nil {
		if x.CapacityBytes != req.capacity {
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict,
				"volume %q is being expanded to %d bytes; ask again when that is done", a.h.id, x.CapacityBytes)})
			return
		}
		a.expanding.waiters = append(a.expanding.waiters, req.reply)
		a.runExpansion(ctx)
		return
	}
	switch {
	case req.capacity < a.rec.CapacityBytes:
		answer(req.reply, reply{err: kinderr.Errorf(ErrInvalid,
			"capacity_bytes %d is less than volume %q's %d bytes: volumes cannot shrink", req.capacity, a.h.id, a.rec.CapacityBytes)})
		return
	case req.capacity == a.rec.CapacityBytes:
		answer(req.reply, reply{vol: a.rec})
		return
	}
	f := req.facts
	controller := f.ControllerService && f.ControllerExpand
	if !controller && !f.NodeExpand {
		answer(req.reply, reply{err: kinderr.Errorf(ErrInvalid,
			"volume %q cannot be expanded: plugin %q has no EXPAND_VOLUME capability (controller or node)", a.h.id, a.rec.Plugin)})
		return
	}
	if n := len(a.rec.Claims) + len(a.rec.PastClaims); n > 0 && f.OfflineExpansion && !f.OnlineExpansion {
		answer(req.reply, reply{err: kinderr.Errorf(ErrInUse,
			"volume %q has %s and plugin %q expands volumes only offline (EXPANSION_OFFLINE): release them first", a.h.id, claimsHeld(len(a.rec.Claims), len(a.rec.PastClaims)), a.rec.Plugin)})
		return
	}
	v := claim.CloneVolume(a.rec)
	v.Expansion = &persistence.Expansion{
		CapacityBytes: req.capacity,
		Controller:    controller,
		NodeCapable:   f.NodeExpand,
		Node:          !controller,
		NodeOffline:   f.OfflineExpansion && !f.OnlineExpansion,
	}
	if err := a.persist(v, "expand"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.log.WithField("capacity_bytes", req.capacity).Info("expanding volume")
	a.expanding.waiters = append(a.expanding.waiters, req.reply)
	a.runExpansion(ctx)
}

// runExpansion starts the next step of the persisted expansion in the
// slot, unless one runs. The slot is free or already the expansion's.
func (a *volumeActor) runExpansion(ctx actor.Context) {
	if a.rec == nil || a.rec.Expansion == nil || a.slot.kind != slotFree || a.expanding.retry != nil {
		return
	}
	x := a.rec.Expansion
	v := a.rec
	capRange := &csipb.CapacityRange{RequiredBytes: x.CapacityBytes}
	var call func(context.Context, *claim.Runner) claim.Result
	if x.Controller {
		creq := &csipb.ControllerExpandVolumeRequest{VolumeId: v.ExternalID, CapacityRange: capRange, Secrets: v.Secrets}
		if len(v.Claims) > 0 {
			creq.VolumeCapability = claim.CapabilityOf(v, &v.Claims[0]).ToCSI()
		}
		var resp *csipb.ControllerExpandVolumeResponse
		call = func(ctx context.Context, r *claim.Runner) claim.Result {
			sec, err := secretsOf(v)
			if err != nil {
				return claim.Result{Err: err, Outcome: csi.Final}
			}
			creq.Secrets = sec
			res := r.Do(ctx, v.Plugin, claim.ControllerPlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
				out, err := c.ControllerExpandVolume(secretfile.WithRef(ctx, v.SecretsFrom), creq)
				resp = out
				return err
			})
			if res.OK() && resp == nil {
				resp = &csipb.ControllerExpandVolumeResponse{}
			}
			return res
		}
		a.startExpansionJob(ctx, call, func(res claim.Result) *expandFinished {
			return &expandFinished{owner: a, res: res, resp: resp}
		})
		return
	}
	var reqs []*csipb.NodeExpandVolumeRequest
	for i := range v.Claims {
		c := &v.Claims[i]
		if c.State != claim.StatePublished {
			continue
		}
		reqs = append(reqs, &csipb.NodeExpandVolumeRequest{
			VolumeId: v.ExternalID, VolumePath: c.TargetPath, StagingTargetPath: c.StagingPath,
			CapacityRange: capRange, VolumeCapability: claim.CapabilityOf(v, c).ToCSI(), Secrets: v.Secrets,
		})
	}
	call = func(ctx context.Context, r *claim.Runner) claim.Result {
		sec, err := secretsOf(v)
		if err != nil {
			return claim.Result{Err: err, Outcome: csi.Final}
		}
		for _, nreq := range reqs {
			nreq.Secrets = sec
			res := r.Do(ctx, v.Plugin, claim.NodePlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
				_, err := c.NodeExpandVolume(ctx, nreq)
				return err
			})
			if !res.OK() {
				return res
			}
		}
		return claim.Result{Outcome: csi.Success}
	}
	a.startExpansionJob(ctx, call, func(res claim.Result) *expandFinished {
		return &expandFinished{owner: a, node: true, res: res}
	})
}

// startExpansionJob runs one attempt of call in the slot. A failure that
// is retried gives the slot back: the backoff (waiting for the plugin to
// be healthy) runs outside it, so claims and releases of the volume go on
// meanwhile (see expansionFinished).
func (a *volumeActor) startExpansionJob(ctx actor.Context, call func(context.Context, *claim.Runner) claim.Result,
	done func(claim.Result) *expandFinished) {
	runner := a.m.runner
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		res := call(jctx, runner)
		if jctx.Err() != nil && !res.OK() {
			return nil // stopping: the next incarnation resumes
		}
		msg := done(res)
		msg.retry = !res.OK() && res.Outcome != csi.Final
		return msg
	})
}

// retryExpansion schedules the next attempt of the expansion's current
// step after a backoff. The slot is free.
func (a *volumeActor) retryExpansion(ctx actor.Context, msg *expandFinished) {
	x := &a.expanding
	x.attempts++
	method, typ := "ControllerExpandVolume", claim.ControllerPlugin
	if msg.node {
		method, typ = "NodeExpandVolume", claim.NodePlugin
	}
	delay := a.m.cfg.Backoff.Delay(x.attempts - 1)
	a.m.runner.Retrying(a.rec.Plugin, method)
	a.log.WithError(msg.res.Err).WithFields(logrus.Fields{"method": method, "attempt": x.attempts, "delay": delay}).
		Info("expansion step failed; retrying with backoff")
	x.retry = a.pauseThen(ctx, a.rec.Plugin, typ, delay, &expandRetryDue{owner: a})
}

func (a *volumeActor) expandRetryDue(ctx actor.Context, msg *expandRetryDue) {
	if msg.owner != a || a.expanding.retry == nil {
		return
	}
	a.retryNow(ctx, &a.expanding, &expandWork{})
}

// retryNow ends the backoff of x's failed step and queues work, which
// runs the step again.
func (a *volumeActor) retryNow(ctx actor.Context, x *expansion, work any) {
	x.retry.Stop()
	x.retry = nil
	a.queue = append(a.queue, work)
	a.settle(ctx)
}

func (a *volumeActor) expansionFinished(ctx actor.Context, msg *expandFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	x := a.rec.Expansion
	if x == nil {
		a.settle(ctx)
		return
	}
	if msg.retry {
		a.retryExpansion(ctx, msg)
		a.settle(ctx)
		return
	}
	a.expanding.attempts = 0
	v := claim.CloneVolume(a.rec)
	if !msg.res.OK() {
		v.Expansion = nil
		a.mustPersist(v, "expand-failed")
		method := "ControllerExpandVolume"
		if msg.node {
			method = "NodeExpandVolume"
		}
		err := kinderr.Errorf(ErrPluginCall, "%s %q to %d bytes: %w", method, a.h.id, x.CapacityBytes, msg.res.Err)
		a.log.WithError(msg.res.Err).WithField("method", method).Error("expansion failed")
		a.m.recordExpandFailed(a.rec, err)
		a.answerExpansion(reply{err: err})
		a.settle(ctx)
		return
	}
	if !msg.node {
		v.CapacityBytes = max(msg.resp.GetCapacityBytes(), x.CapacityBytes)
		next := *x
		next.Controller = false
		required := msg.resp.GetNodeExpansionRequired() && x.NodeCapable
		next.Node = required && hasPublished(v) && !x.NodeOffline
		if next.Node {
			v.Expansion = &next
			a.mustPersist(v, "expand-controller")
			a.runExpansion(ctx)
			a.settle(ctx)
			return
		}
		v.Expansion = nil
		if required {
			// No published claim to expand on, or a node that expands
			// only while the volume is not published: the next publish
			// runs NodeExpandVolume (see expandOnPublish).
			v.NodeExpandPending = max(v.NodeExpandPending, x.CapacityBytes)
			a.log.WithField("capacity_bytes", x.CapacityBytes).Info("controller expanded the volume; the node expands it on its next publish")
		}
		a.mustPersist(v, "expand-controller")
	} else {
		v.CapacityBytes = max(v.CapacityBytes, x.CapacityBytes)
		v.Expansion = nil
		a.mustPersist(v, "expand-node")
	}
	a.log.WithField("capacity_bytes", v.CapacityBytes).Info("volume expanded")
	a.answerExpansion(reply{vol: a.rec})
	a.settle(ctx)
}

func (a *volumeActor) answerExpansion(r reply) {
	answerAll(a.expanding.waiters, r)
	a.expanding.waiters = nil
}

func hasPublished(v *persistence.Volume) bool {
	for i := range v.Claims {
		if v.Claims[i].State == claim.StatePublished {
			return true
		}
	}
	return false
}
