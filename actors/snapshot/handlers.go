package snapshot

import (
	"context"
	"fmt"
	"github.com/csiactor/csiactor/internal/kinderr"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

// Fault points, as the crash hook names them (each "persist:" before the
// write and "persisted:" after): "snapshot-create" (the intent, before the
// first CreateSnapshot), "snapshot-created" (ready), "snapshot-create-failed"
// (refused for good; the record is deleted), "snapshot-delete" (the
// intent, before the first DeleteSnapshot), "snapshot-deleted" (the record
// is deleted) and "snapshot-delete-failed" (refused for good; ready again).

func answer(ch chan<- reply, r reply) {
	select {
	case ch <- r:
	default: // buffered with room for one
	}
}

// started loads every record and resumes the creates and deletes under
// way. A store error panics: the supervisor restarts the actor after a
// backoff and it tries again.
func (a *snapActor) started(ctx actor.Context) {
	recs, err := a.m.store.Snapshots(context.Background())
	if err != nil {
		select {
		case a.loaded <- err:
			return // the first start fails: Start reports it
		default:
		}
		panic(fmt.Errorf("load snapshots: %w", err))
	}
	resumed := 0
	for i := range recs {
		rec := &recs[i]
		a.recs[rec.ID] = rec
		switch rec.State {
		case persistence.SnapshotCreating:
			a.startCreate(ctx, rec)
			resumed++
		case persistence.SnapshotDeleting:
			a.startDelete(ctx, rec)
			resumed++
		}
	}
	a.m.log.WithFields(logrus.Fields{"snapshots": len(recs), "resumed": resumed}).Info("snapshot manager started")
	select {
	case a.loaded <- nil:
	default:
	}
}

// persist writes rec (a new record, never modified afterwards) and makes
// it the snapshot's record.
func (a *snapActor) persist(rec *persistence.Snapshot, point string) error {
	rec.Revision = 1
	if old := a.recs[rec.ID]; old != nil {
		rec.Revision = old.Revision + 1
	}
	rec.UpdatedAt = time.Now()
	a.m.faultPoint("persist:", point, rec.ID)
	if err := a.m.store.PutSnapshot(context.Background(), *rec); err != nil {
		return fmt.Errorf("persist snapshot %q: %w", rec.ID, err)
	}
	a.recs[rec.ID] = rec
	a.m.faultPoint("persisted:", point, rec.ID)
	return nil
}

// remove deletes snapshot id's record.
func (a *snapActor) remove(id, point string) error {
	a.m.faultPoint("persist:", point, id)
	if err := a.m.store.DeleteSnapshot(context.Background(), id); err != nil {
		return fmt.Errorf("delete snapshot %q: %w", id, err)
	}
	delete(a.recs, id)
	a.m.faultPoint("persisted:", point, id)
	return nil
}

func (a *snapActor) notFound(field, id string) error {
	if field != "" {
		return kinderr.Errorf(ErrNotFound, "%s: snapshot %q not found", field, id)
	}
	return kinderr.Errorf(ErrNotFound, "snapshot %q not found", id)
}

func (a *snapActor) view(rec *persistence.Snapshot) Snapshot { return viewOf(rec, a.holds[rec.ID]) }

func (a *snapActor) create(ctx actor.Context, req *createRequest) {
	if a.stopping {
		answer(req.reply, reply{err: ErrShutdown})
		return
	}
	if rec := a.recs[req.spec.ID]; rec != nil {
		switch {
		case !req.spec.sameAs(rec):
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "snapshot %q is already recorded with a different definition (plugin %q, source_volume %q)", rec.ID, rec.Plugin, rec.SourceVolume)})
		case rec.State == persistence.SnapshotReady:
			answer(req.reply, reply{snap: a.view(rec)})
		case rec.State == persistence.SnapshotDeleting:
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "snapshot %q is being deleted", rec.ID)})
		default:
			a.join(ctx, rec, req.reply)
		}
		return
	}
	now := time.Now()
	rec := &persistence.Snapshot{
		ID: req.spec.ID, Plugin: req.spec.Plugin, SourceVolume: req.spec.SourceVolume, SourceExternalID: req.sourceExt,
		Parameters: maps.Clone(req.spec.Parameters), Secrets: maps.Clone(req.spec.Secrets),
		State: persistence.SnapshotCreating, CreatedAt: now,
	}
	if err := a.persist(rec, "snapshot-create"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.m.emit(rec, EventSnapshotCreating, "taking a snapshot of volume %s", rec.SourceVolume)
	a.m.log.WithFields(logrus.Fields{"snapshot": rec.ID, "volume": rec.SourceVolume, "plugin": rec.Plugin}).Info("taking a snapshot")
	a.startCreate(ctx, rec)
	a.ops[rec.ID].waiters = append(a.ops[rec.ID].waiters, req.reply)
}

// join adds a caller to the op under way on rec, starting it again if it
// is not running (a store failure ended it).
func (a *snapActor) join(ctx actor.Context, rec *persistence.Snapshot, ch chan<- reply) {
	o := a.ops[rec.ID]
	if o == nil {
		if rec.State == persistence.SnapshotDeleting {
			a.startDelete(ctx, rec)
		} else {
			a.startCreate(ctx, rec)
		}
		o = a.ops[rec.ID]
	}
	o.waiters = append(o.waiters, ch)
}

// startCreate runs CreateSnapshot for rec until the plugin answers with a
// snapshot ready to use, or refuses for good; retryable failures and a
// snapshot not ready yet are retried with backoff, waiting for the plugin
// to be healthy.
func (a *snapActor) startCreate(ctx actor.Context, rec *persistence.Snapshot) {
	creq := &csipb.CreateSnapshotRequest{
		SourceVolumeId: rec.SourceExternalID, Name: rec.ID,
		Secrets: maps.Clone(rec.Secrets), Parameters: maps.Clone(rec.Parameters),
	}
	id := rec.ID
	a.startJob(ctx, rec, false, "CreateSnapshot", csi.PublishKind, func(c context.Context, cl csi.Client) (*csipb.Snapshot, error) {
		resp, err := cl.CreateSnapshot(c, creq)
		if err != nil {
			return nil, err
		}
		s := resp.GetSnapshot()
		if s.GetSnapshotId() == "" {
			return nil, fmt.Errorf("CreateSnapshot %q: %w: no snapshot id", id, csi.ErrInvalidResponse)
		}
		return s, nil
	})
}

// startDelete runs DeleteSnapshot for rec until it succeeds (NotFound
// counts) or the plugin refuses for good.
func (a *snapActor) startDelete(ctx actor.Context, rec *persistence.Snapshot) {
	dreq := &csipb.DeleteSnapshotRequest{SnapshotId: rec.ExternalID, Secrets: maps.Clone(rec.Secrets)}
	a.startJob(ctx, rec, true, "DeleteSnapshot", csi.UnpublishKind, func(c context.Context, cl csi.Client) (*csipb.Snapshot, error) {
		if dreq.SnapshotId == "" {
			return nil, nil // the plugin never named it: nothing to delete
		}
		return nil, cl.DeleteSnapshot(c, dreq)
	})
}

func (a *snapActor) startJob(ctx actor.Context, rec *persistence.Snapshot, del bool, method string, kind csi.RPCKind,
	call func(context.Context, csi.Client) (*csipb.Snapshot, error)) {
	runner, backoff, plugin, id := a.m.runner, a.m.cfg.Backoff, rec.Plugin, rec.ID
	root, self, log := ctx.ActorSystem().Root, ctx.Self(), a.m.log.WithFields(logrus.Fields{"snapshot": id, "plugin": plugin, "method": method})
	job := claim.StartJob(nil, root, self, func(jctx context.Context) any {
		for attempt := 0; ; attempt++ {
			var snap *csipb.Snapshot
			res := runner.Do(jctx, plugin, claim.ControllerPlugin, kind, func(c context.Context, cl csi.Client) error {
				s, err := call(c, cl)
				snap = s
				return err
			})
			if jctx.Err() != nil {
				return nil // stopping: the next start resumes it
			}
			if res.OK() && (del || snap.GetReadyToUse()) || !res.OK() && res.Outcome == csi.Final {
				return &opDone{owner: a, id: id, delete: del, res: res, snap: snap}
			}
			delay := backoff.Delay(attempt)
			if res.OK() {
				root.Send(self, &progress{owner: a, id: id, snap: snap, attempts: attempt + 1})
				log.WithField("delay", delay).Info("snapshot cut but not ready to use yet; asking again")
			} else {
				runner.Retrying(plugin, method)
				root.Send(self, &progress{owner: a, id: id, err: res.Err, attempts: attempt + 1})
				log.WithError(res.Err).WithFields(logrus.Fields{"attempt": attempt + 1, "delay": delay}).Info("snapshot call failed; retrying with backoff")
			}
			if runner.Pause(jctx, plugin, claim.ControllerPlugin, delay) != nil {
				return nil
			}
		}
	})
	if o := a.ops[id]; o != nil {
		o.job.Stop()
		o.job, o.delete = job, del
		return
	}
	a.ops[id] = &op{delete: del, job: job}
}

// progress records what the plugin said between attempts, in memory: the
// record on disk needs no more to resume.
func (a *snapActor) progress(msg *progress) {
	rec := a.recs[msg.id]
	if msg.owner != a || rec == nil || a.ops[msg.id] == nil {
		return
	}
	next := *rec
	next.Attempts = msg.attempts
	if msg.err != nil {
		next.LastError = msg.err.Error()
	} else {
		next.LastError = ""
		applySnapshot(&next, msg.snap)
	}
	a.recs[msg.id] = &next
}

func applySnapshot(rec *persistence.Snapshot, s *csipb.Snapshot) {
	if s == nil {
		return
	}
	rec.ExternalID = s.GetSnapshotId()
	rec.SizeBytes = s.GetSizeBytes()
	rec.ReadyToUse = s.GetReadyToUse()
	if t := s.GetCreationTime(); t != nil {
		rec.CreationTime = t.AsTime()
	}
}

func (a *snapActor) opDone(msg *opDone) {
	if msg.owner != a {
		return
	}
	o, rec := a.ops[msg.id], a.recs[msg.id]
	if o == nil || rec == nil {
		return
	}
	o.job.Stop()
	delete(a.ops, msg.id)
	var err error
	if msg.delete {
		err = a.deleted(rec, msg.res)
	} else {
		err = a.created(rec, msg)
	}
	r := reply{err: err}
	if cur := a.recs[msg.id]; err == nil && cur != nil {
		r.snap = a.view(cur)
	}
	for _, ch := range o.waiters {
		answer(ch, r)
	}
}

// created records the outcome of a create and returns the error to
// answer its callers with.
func (a *snapActor) created(rec *persistence.Snapshot, msg *opDone) error {
	log := a.m.log.WithFields(logrus.Fields{"snapshot": rec.ID, "volume": rec.SourceVolume, "plugin": rec.Plugin})
	if !msg.res.OK() {
		err := kinderr.Errorf(ErrPluginCall, "CreateSnapshot of snapshot %q (volume %q): %w", rec.ID, rec.SourceVolume, msg.res.Err)
		if rerr := a.remove(rec.ID, "snapshot-create-failed"); rerr != nil {
			panic(rerr) // restarted, the actor calls CreateSnapshot again and learns the same
		}
		log.WithError(msg.res.Err).Error("snapshot failed")
		a.m.emit(rec, EventSnapshotCreateFailed, "snapshot of volume %s failed: %s", rec.SourceVolume, msg.res.Err.Error())
		return err
	}
	next := *rec
	applySnapshot(&next, msg.snap)
	next.State, next.LastError, next.Attempts = persistence.SnapshotReady, "", 0
	if err := a.persist(&next, "snapshot-created"); err != nil {
		panic(err) // restarted, the actor calls CreateSnapshot again (idempotent by name)
	}
	log.WithField("external_id", next.ExternalID).Info("snapshot taken")
	a.m.emit(&next, EventSnapshotCreated, "snapshot of volume %s taken (%s, %d bytes)", next.SourceVolume, next.ExternalID, next.SizeBytes)
	return nil
}

// deleted records the outcome of a delete and returns the error to
// answer its callers with.
func (a *snapActor) deleted(rec *persistence.Snapshot, res claim.Result) error {
	log := a.m.log.WithFields(logrus.Fields{"snapshot": rec.ID, "plugin": rec.Plugin})
	if !res.OK() {
		err := kinderr.Errorf(ErrPluginCall, "DeleteSnapshot of snapshot %q: %w", rec.ID, res.Err)
		next := *rec
		next.State, next.LastError, next.Attempts = persistence.SnapshotReady, res.Err.Error(), 0
		if perr := a.persist(&next, "snapshot-delete-failed"); perr != nil {
			panic(perr)
		}
		log.WithError(res.Err).Error("snapshot delete failed")
		a.m.emit(rec, EventSnapshotDeleteFailed, "delete failed: %s", res.Err.Error())
		return err
	}
	if err := a.remove(rec.ID, "snapshot-deleted"); err != nil {
		panic(err) // restarted, the actor calls DeleteSnapshot again (idempotent)
	}
	log.Info("snapshot deleted")
	a.m.emit(rec, EventSnapshotDeleted, "snapshot deleted")
	return nil
}

func (a *snapActor) delete(ctx actor.Context, req *deleteRequest) {
	rec := a.recs[req.id]
	switch {
	case a.stopping:
		answer(req.reply, reply{err: ErrShutdown})
		return
	case rec == nil:
		answer(req.reply, reply{err: a.notFound("", req.id)})
		return
	case a.holds[req.id] > 0:
		answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "snapshot %q is being restored into %d volume(s); delete it when that is done", req.id, a.holds[req.id])})
		return
	case rec.State == persistence.SnapshotCreating:
		answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "snapshot %q is being created; delete it when that is done", req.id)})
		return
	case rec.State == persistence.SnapshotDeleting:
		a.join(ctx, rec, req.reply)
		return
	}
	next := *rec
	next.State, next.LastError, next.Attempts = persistence.SnapshotDeleting, "", 0
	if err := a.persist(&next, "snapshot-delete"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.m.log.WithFields(logrus.Fields{"snapshot": rec.ID, "plugin": rec.Plugin}).Info("deleting snapshot")
	a.startDelete(ctx, &next)
	a.ops[rec.ID].waiters = append(a.ops[rec.ID].waiters, req.reply)
}

func (a *snapActor) get(req *getRequest) {
	rec := a.recs[req.id]
	if rec == nil {
		answer(req.reply, reply{err: a.notFound("", req.id)})
		return
	}
	answer(req.reply, reply{snap: a.view(rec)})
}

func (a *snapActor) list(req *listRequest) {
	ids := make([]string, 0, len(a.recs))
	for id, rec := range a.recs {
		if req.filter.match(rec) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]Snapshot, 0, len(ids))
	for _, id := range ids {
		out = append(out, a.view(a.recs[id]))
	}
	answer(req.reply, reply{list: out})
}

func (a *snapActor) hold(req *holdRequest) {
	rec := a.recs[req.id]
	switch {
	case a.stopping:
		answer(req.reply, reply{err: ErrShutdown})
	case rec == nil:
		answer(req.reply, reply{err: a.notFound("content_source.snapshot", req.id)})
	case rec.Plugin != req.plugin:
		answer(req.reply, reply{err: kinderr.Errorf(ErrInvalid, "content_source.snapshot: snapshot %q is of plugin %q, not %q", req.id, rec.Plugin, req.plugin)})
	case rec.State != persistence.SnapshotReady:
		answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "content_source.snapshot: snapshot %q is %s, not ready", req.id, rec.State)})
	default:
		a.holds[req.id]++
		answer(req.reply, reply{snap: a.view(rec)})
	}
}

func (a *snapActor) unhold(req *unholdRequest) {
	if a.holds[req.id] <= 1 {
		delete(a.holds, req.id)
		return
	}
	a.holds[req.id]--
}

// stopWork stops every goroutine the actor owns and answers the callers
// it holds: a restarted actor resumes the ops from the records, and its
// callers ask again.
func (a *snapActor) stopWork() {
	a.stopping = true
	for id, o := range a.ops {
		o.job.Stop()
		for _, ch := range o.waiters {
			answer(ch, reply{err: kinderr.Errorf(ErrShutdown, "snapshot %q: the snapshot actor stopped before it was done; ask again", id)})
		}
		delete(a.ops, id)
	}
}
