package volume

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/secretfile"
)

// Modification steps, as the fault points name them: "modify" (the
// intent, before the first ControllerModifyVolume), "modified" (done, the
// parameters merged into the volume's) and "modify-failed" (given up, the
// intent removed).

// modifyRequest is sent to a volume actor by Manager.Modify. The reply
// comes when the modification is done or has failed for good.
type modifyRequest struct {
	params map[string]string
	reply  chan<- reply
}

// modifyWork resumes the persisted modification of a restarted actor.
type modifyWork struct{}

// modifyFinished is sent to a volume actor by the goroutine that ran one
// ControllerModifyVolume.
type modifyFinished struct {
	owner *volumeActor
	res   claim.Result
	retry bool // the call failed in a way that is retried (res says how)
}

// modifyRetryDue is sent to a volume actor when the backoff of a failed
// ControllerModifyVolume has passed (and the controller is healthy).
type modifyRetryDue struct{ owner *volumeActor }

// Modify changes volume id's mutable parameters through its plugin's
// controller (ControllerModifyVolume, MODIFY_VOLUME). The modification is
// persisted before its first RPC and resumed after a crash; it returns
// when it is done, with the volume's mutable parameters, params merged
// into those applied before.
//
// It fails with ErrInvalid for no parameters, or a plugin whose
// controller has no MODIFY_VOLUME capability, with ErrConflict while a
// modification with other parameters is in progress, and with
// ErrPluginCall (wrapping the plugin's error) when the plugin refuses it.
// Asking again for the parameters of a modification in progress waits
// for it; asking for parameters the volume has already returns at once.
func (m *Manager) Modify(ctx context.Context, id string, params map[string]string) (Volume, error) {
	if err := claim.CheckName("id", id); err != nil {
		return Volume{}, err
	}
	if err := checkMutableParameters(params); err != nil {
		return Volume{}, err
	}
	v, err := m.Get(ctx, id)
	if err != nil {
		return Volume{}, err
	}
	if err := m.checkModify(ctx, v.Plugin, id); err != nil {
		return Volume{}, err
	}
	params = maps.Clone(params)
	r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
		return &modifyRequest{params: params, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Volume{}, err
	}
	return viewOf(r.vol), nil
}

// checkMutableParameters checks the parameters of a modification: at
// least one, none with an empty name.
func checkMutableParameters(params map[string]string) error {
	if len(params) == 0 {
		return kinderr.Errorf(ErrInvalid, "mutable_parameters is empty: name at least one parameter to change")
	}
	if _, ok := params[""]; ok {
		return kinderr.Errorf(ErrInvalid, "mutable_parameters: a parameter name is empty")
	}
	return nil
}

// checkModify asks the registry whether plugin's controller can modify
// volumes: ErrInvalid naming MODIFY_VOLUME when the plugin has no
// controller service or its controller lacks the capability.
func (m *Manager) checkModify(ctx context.Context, plugin, id string) error {
	if _, facts, err := m.plugins.Client(ctx, plugin, claim.NodePlugin); err == nil && !facts.ControllerService {
		return kinderr.Errorf(ErrInvalid,
			"volume %q cannot be modified: plugin %q has no controller service, so no MODIFY_VOLUME capability", id, plugin)
	}
	_, facts, err := m.plugins.Client(ctx, plugin, claim.ControllerPlugin)
	if err != nil {
		return kinderr.Errorf(ErrPluginUnavailable, "plugin %q (controller): %w", plugin, err)
	}
	if !facts.ControllerModify {
		return kinderr.Errorf(ErrInvalid,
			"volume %q cannot be modified: plugin %q's controller has no MODIFY_VOLUME capability", id, plugin)
	}
	return nil
}

// modifyArrived takes a modification request: at once while another
// modification is in progress (it joins it or is a conflict, without
// waiting for the slot), in the queue otherwise.
func (a *volumeActor) modifyArrived(ctx actor.Context, req *modifyRequest) {
	if a.rec != nil && len(a.rec.Modifying) > 0 {
		a.modify(ctx, req)
		a.settle(ctx)
		return
	}
	a.enqueue(ctx, req)
}

// modify handles a modification request. The slot is free, or the
// record has a modification in progress (see modifyArrived).
func (a *volumeActor) modify(ctx actor.Context, req *modifyRequest) {
	if a.rec == nil {
		answer(req.reply, reply{err: a.notFound()})
		return
	}
	if cur := a.rec.Modifying; len(cur) > 0 {
		if !maps.Equal(cur, req.params) {
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict,
				"volume %q is being modified (mutable parameters %s); ask again when that is done", a.h.id, paramNames(cur))})
			return
		}
		a.modifying.waiters = append(a.modifying.waiters, req.reply)
		a.runModification(ctx)
		return
	}
	if applied(a.rec.MutableParameters, req.params) {
		answer(req.reply, reply{vol: a.rec})
		return
	}
	v := claim.CloneVolume(a.rec)
	v.Modifying = req.params
	if err := a.persist(v, "modify"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.log.WithField("mutable_parameters", paramNames(req.params)).Info("modifying volume")
	a.modifying.waiters = append(a.modifying.waiters, req.reply)
	a.runModification(ctx)
}

// runModification starts ControllerModifyVolume of the persisted
// modification in the slot, unless one runs or waits for its backoff.
func (a *volumeActor) runModification(ctx actor.Context) {
	if a.rec == nil || len(a.rec.Modifying) == 0 || a.slot.kind != slotFree || a.modifying.retry != nil {
		return
	}
	v := a.rec
	mreq := &csipb.ControllerModifyVolumeRequest{VolumeId: v.ExternalID, MutableParameters: v.Modifying}
	runner := a.m.runner
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		var res claim.Result
		if sec, err := secretsOf(v); err != nil {
			// Not sent without its secrets: given up, like a refusal.
			res = claim.Result{Err: err, Outcome: csi.Final}
		} else {
			mreq.Secrets = sec
			res = runner.Do(jctx, v.Plugin, claim.ControllerPlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
				_, err := c.ControllerModifyVolume(secretfile.WithRef(ctx, v.SecretsFrom), mreq)
				return err
			})
		}
		if jctx.Err() != nil && !res.OK() {
			return nil // stopping: the next incarnation resumes
		}
		return &modifyFinished{owner: a, res: res, retry: !res.OK() && res.Outcome != csi.Final}
	})
}

func (a *volumeActor) modifyRetryDue(ctx actor.Context, msg *modifyRetryDue) {
	if msg.owner != a || a.modifying.retry == nil {
		return
	}
	a.retryNow(ctx, &a.modifying, &modifyWork{})
}

func (a *volumeActor) modificationFinished(ctx actor.Context, msg *modifyFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	params := a.rec.Modifying
	if len(params) == 0 {
		a.settle(ctx)
		return
	}
	x := &a.modifying
	if msg.retry {
		// The backoff runs outside the slot: claims go on meanwhile.
		x.attempts++
		delay := a.m.cfg.Backoff.Delay(x.attempts - 1)
		a.m.runner.Retrying(a.rec.Plugin, "ControllerModifyVolume")
		a.log.WithError(msg.res.Err).WithFields(logrus.Fields{"attempt": x.attempts, "delay": delay}).
			Info("ControllerModifyVolume failed; retrying with backoff")
		x.retry = a.pauseThen(ctx, a.rec.Plugin, claim.ControllerPlugin, delay, &modifyRetryDue{owner: a})
		a.settle(ctx)
		return
	}
	x.attempts = 0
	v := claim.CloneVolume(a.rec)
	v.Modifying = nil
	if !msg.res.OK() {
		a.mustPersist(v, "modify-failed")
		err := kinderr.Errorf(ErrPluginCall, "ControllerModifyVolume %q (mutable parameters %s): %w", a.h.id, paramNames(params), msg.res.Err)
		a.log.WithError(msg.res.Err).Error("modification failed")
		a.m.recordModifyFailed(a.rec, err)
		a.answerModification(reply{err: err})
		a.settle(ctx)
		return
	}
	v.MutableParameters = mergeParams(a.rec.MutableParameters, params)
	a.mustPersist(v, "modified")
	a.log.WithField("mutable_parameters", paramNames(params)).Info("volume modified")
	a.answerModification(reply{vol: a.rec})
	a.settle(ctx)
}

func (a *volumeActor) answerModification(r reply) {
	answerAll(a.modifying.waiters, r)
	a.modifying.waiters = nil
}

// applied reports whether every parameter of params has its value in
// have already.
func applied(have, params map[string]string) bool {
	for k, v := range params {
		if w, ok := have[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// mergeParams returns a new map: base with params over it; nil when both
// are empty.
func mergeParams(base, params map[string]string) map[string]string {
	if len(base)+len(params) == 0 {
		return nil
	}
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, params)
	return out
}

// paramNames lists the names of params, sorted, for messages (values may
// be anything; names are what the caller chose).
func paramNames(params map[string]string) string {
	return strings.Join(slices.Sorted(maps.Keys(params)), ", ")
}
