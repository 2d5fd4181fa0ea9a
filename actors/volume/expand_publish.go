package volume

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
)

// pendingExpandFinished is sent to a volume actor by the goroutine that
// ran the NodeExpandVolume a publish owed the volume
// (persistence.Volume.NodeExpandPending) on alloc's new claim.
type pendingExpandFinished struct {
	owner    *volumeActor
	alloc    string
	capacity int64
	res      claim.Result
}

// expandOnPublish runs, in the slot, the NodeExpandVolume the volume owes
// since its controller expanded it while no claim could be expanded on the
// node (none published, or a node plugin that expands only offline), on
// alloc's claim that has just been published. It reports false when there
// is nothing to run. The slot is free.
func (a *volumeActor) expandOnPublish(ctx actor.Context, alloc string) bool {
	i := claim.FindClaim(a.rec.Claims, alloc)
	if i < 0 || a.rec.Claims[i].State != claim.StatePublished {
		return false
	}
	v, c, capacity := a.rec, &a.rec.Claims[i], a.rec.NodeExpandPending
	nreq := &csipb.NodeExpandVolumeRequest{
		VolumeId: v.ExternalID, VolumePath: c.TargetPath, StagingTargetPath: c.StagingPath,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: capacity}, VolumeCapability: claim.CapabilityOf(v, c).ToCSI(),
		Secrets: v.Secrets,
	}
	runner, plugin := a.m.runner, v.Plugin
	a.occupy(ctx, slot{kind: slotPublish, alloc: alloc}, func(jctx context.Context) any {
		sec, err := secretsOf(v)
		if err != nil {
			return &pendingExpandFinished{owner: a, alloc: alloc, capacity: capacity, res: claim.Result{Err: err, Outcome: csi.Final}}
		}
		nreq.Secrets = sec
		res := runner.Do(jctx, plugin, claim.NodePlugin, csi.PublishKind, func(ctx context.Context, cl csi.Client) error {
			_, err := cl.NodeExpandVolume(ctx, nreq)
			return err
		})
		if jctx.Err() != nil {
			return nil
		}
		return &pendingExpandFinished{owner: a, alloc: alloc, capacity: capacity, res: res}
	})
	return true
}

// pendingExpandFinished records the owed NodeExpandVolume as done (or
// given up, when the plugin refused it for good: the claim stays
// published, and an event says why), or retries it with backoff; the
// claim's callers are answered once it is done or given up.
func (a *volumeActor) pendingExpandFinished(ctx actor.Context, msg *pendingExpandFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	if a.rec == nil || claim.FindClaim(a.rec.Claims, msg.alloc) < 0 {
		a.settle(ctx)
		return
	}
	log := a.log.WithFields(logrus.Fields{"alloc": msg.alloc, "method": "NodeExpandVolume", "capacity_bytes": msg.capacity})
	if !msg.res.OK() && msg.res.Outcome != csi.Final {
		w := a.work(msg.alloc)
		w.expandAttempts++
		delay := a.m.cfg.Backoff.Delay(w.expandAttempts - 1)
		a.m.runner.Retrying(a.rec.Plugin, "NodeExpandVolume")
		log.WithError(msg.res.Err).WithFields(logrus.Fields{"attempt": w.expandAttempts, "delay": delay}).Info("node expansion on publish failed; retrying with backoff")
		w.retry = a.pauseThen(ctx, a.rec.Plugin, claim.NodePlugin, delay, &retryDue{owner: a, alloc: msg.alloc})
		a.settle(ctx)
		return
	}
	if w := a.allocs[msg.alloc]; w != nil {
		w.expandAttempts = 0
		a.tidy(msg.alloc)
	}
	v := claim.CloneVolume(a.rec)
	if v.NodeExpandPending == msg.capacity {
		v.NodeExpandPending = 0
	}
	if msg.res.OK() {
		v.CapacityBytes = max(v.CapacityBytes, msg.capacity)
		log.Info("volume expanded on the node as it was published")
	} else {
		log.WithError(msg.res.Err).Error("node expansion on publish failed; the claim stays published at the old size")
		a.m.recordExpandFailed(a.rec, fmt.Errorf("%w: NodeExpandVolume %q to %d bytes on publish for alloc %q: %w",
			ErrPluginCall, a.h.id, msg.capacity, msg.alloc, msg.res.Err))
	}
	a.mustPersist(v, "expand-node-pending")
	a.answerPublished(msg.alloc)
	a.settle(ctx)
}
