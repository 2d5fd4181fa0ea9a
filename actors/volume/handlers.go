package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/secretfile"
	"github.com/csiactor/csiactor/persistence"
)

// advanceWork asks for the next publish step of alloc's claim.
type advanceWork struct{ alloc string }

// recheckWork checks the host for alloc's published claim, which a caller
// claimed again, before it is answered.
type recheckWork struct{ alloc string }

// turnWork is a claim actor's request for a release turn.
type turnWork struct{ alloc string }

func answer(ch chan<- reply, r reply) {
	select {
	case ch <- r:
	default: // buffered with room for one; a second answer is dropped
	}
}

func answerAll(chs []chan<- reply, r reply) {
	for _, ch := range chs {
		answer(ch, r)
	}
}

// started loads the record and resumes its unfinished steps. A store error
// panics: the supervisor restarts the actor after a backoff and it tries
// again.
func (a *volumeActor) started(ctx actor.Context) {
	v, err := a.m.store.Volume(context.Background(), a.h.id)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		a.rec = nil
	case err != nil:
		panic(fmt.Errorf("load volume %q: %w", a.h.id, err))
	default:
		claim.DistrustTeardowns(&v)
		a.rec = &v
		a.m.registered(a.h.id, a.rec)
	}
	a.m.publish(a.h, a.rec)
	if a.rec != nil {
		for i := range a.rec.Claims {
			if a.rec.Claims[i].State != claim.StatePublished {
				a.queue = append(a.queue, &advanceWork{alloc: a.rec.Claims[i].Alloc})
			}
		}
		for i := range a.rec.PastClaims {
			a.spawnClaimer(ctx, a.rec.PastClaims[i].Alloc)
		}
		if a.rec.Expansion != nil {
			a.queue = append(a.queue, &expandWork{})
		}
		if len(a.rec.Modifying) > 0 {
			a.queue = append(a.queue, &modifyWork{})
		}
	}
	a.settle(ctx)
	a.h.disp.SetInline(true)
}

// persist writes v (a modified copy of a.rec) durably and makes it the
// record and the published snapshot. It is for what a caller is answered
// about or what must be known before an RPC: a claim's intent (reserved,
// with its usage counts) before its first RPC, its outcome (published, or
// failed) before its caller is answered, a release (taken) before it is
// answered, and every change a request asks for.
func (a *volumeActor) persist(v *persistence.Volume, point string) error {
	return a.save(v, point, a.m.store.PutVolume)
}

// mustPersist is persist for a step's result: the plugin has already acted,
// so a store failure crashes the actor, which reloads the last record and
// runs the (idempotent) step again.
func (a *volumeActor) mustPersist(v *persistence.Volume, point string) {
	if err := a.persist(v, point); err != nil {
		panic(err)
	}
}

// persistStep is mustPersist for a step in between a durable intent and a
// durable outcome (controller-published, staged, a release's teardown
// steps, a failed attempt that is retried): it does not wait for the disk.
// A crash may lose it; resuming from the last durable record then sends
// the step's idempotent RPC again.
func (a *volumeActor) persistStep(v *persistence.Volume, point string) {
	if err := a.save(v, point, a.m.store.PutVolumeDeferred); err != nil {
		panic(err)
	}
}

// save writes v with put and makes it the record and the published
// snapshot.
func (a *volumeActor) save(v *persistence.Volume, point string, put func(context.Context, persistence.Volume) error) error {
	v.Revision = 1
	if a.rec != nil {
		v.Revision = a.rec.Revision + 1
	}
	v.UpdatedAt = time.Now()
	a.m.faultPoint("persist:", point, a.h.id)
	if err := put(context.Background(), *v); err != nil {
		return fmt.Errorf("persist volume %q: %w", a.h.id, err)
	}
	old := a.rec
	a.rec = v
	if inUse(old) != inUse(v) {
		a.m.noteUse(v)
	}
	if statsTarget(v) == nil && statsTarget(old) != nil {
		a.m.stats.forget(a.h.id) // its series disappear with the claim
	}
	// A freed claim is handed to the cluster before the status and the
	// events show it freed: whoever reads it freed here and then updates
	// or deregisters the volume on this host finds it being freed (not
	// held) in the cluster too.
	a.freeHosts(old, v)
	a.m.publish(a.h, v)
	a.m.recordEvents(old, v, a.forgetting...)
	a.m.faultPoint("persisted:", point, a.h.id)
	return nil
}

func (a *volumeActor) enqueue(ctx actor.Context, w any) {
	a.queue = append(a.queue, w)
	a.settle(ctx)
}

// settle starts queued work while the slot is free, then arms or disarms
// the idle timer.
func (a *volumeActor) settle(ctx actor.Context) {
	if a.stopping || a.removed {
		// Removed: its queued requests are sent again to the next
		// actor of the volume once this one has stopped.
		return
	}
	for a.slot.kind == slotFree && len(a.queue) > 0 && !a.stopping {
		w := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		switch w := w.(type) {
		case *advanceWork:
			a.advance(ctx, w.alloc)
		case *recheckWork:
			a.startRecheck(ctx, w.alloc)
		case *reconcileRequest:
			a.reconcile(w)
		case *turnWork:
			a.grantTurn(ctx, w.alloc)
		case *registerRequest:
			a.register(ctx, w)
		case *deregisterRequest:
			a.deregister(ctx, w)
		case *expandRequest:
			a.expand(ctx, w)
		case *expandWork:
			a.runExpansion(ctx)
		case *modifyRequest:
			a.modify(ctx, w)
		case *modifyWork:
			a.runModification(ctx)
		case *statsRequest:
			a.pollStats(ctx, w)
		case *forceWork:
			a.runForce(ctx, w.alloc)
		case *ephemeralRequest:
			a.ephemeral(ctx, w)
		}
	}
	if a.stopping {
		return
	}
	a.driveEphemeral(ctx)
	idle := a.isIdle()
	switch {
	case idle && a.idle == nil && a.m.cfg.IdleTimeout > 0:
		a.idleGen++
		gen, self, root := a.idleGen, ctx.Self(), ctx.ActorSystem().Root
		d := a.m.cfg.IdleTimeout
		if a.mirrored {
			d = min(d, mirroredIdleTimeout)
		}
		a.idle = time.AfterFunc(d, func() {
			root.Send(self, &idleTimeout{owner: a, gen: gen})
		})
	case !idle && a.idle != nil:
		a.idle.Stop()
		a.idle = nil
	}
}

// mirroredIdleTimeout is how long an idle actor started to mirror a
// definition stays in memory (see volumeActor.mirrored).
const mirroredIdleTimeout = 100 * time.Millisecond

func (a *volumeActor) isIdle() bool {
	return a.slot == (slot{}) && len(a.queue) == 0 && len(a.allocs) == 0 &&
		len(a.expanding.waiters) == 0 && a.expanding.retry == nil &&
		len(a.eph.waiters) == 0 && a.eph.retry == nil &&
		len(a.modifying.waiters) == 0 && a.modifying.retry == nil &&
		(a.rec == nil || !claim.Unfinished(a.rec) && !ephemeralPending(a.rec))
}

func (a *volumeActor) idleTimeout(ctx actor.Context, msg *idleTimeout) {
	if msg.owner != a || msg.gen != a.idleGen || a.idle == nil {
		return
	}
	a.idle = nil
	if a.isIdle() && a.m.tryPassivate(a.h) {
		a.passivated = true
		ctx.Stop(ctx.Self())
		return
	}
	a.settle(ctx)
}

func (a *volumeActor) notFound() error {
	return kinderr.Errorf(ErrNotFound, "volume %q not found", a.h.id)
}

// claim handles a new claim request: an idempotent repeat joins (or is
// answered by) the existing claim; a new one needs the node plugin's facts
// first: at once from a claim.CachedPlugins that has them, otherwise from a
// lookup in a goroutine. Then it is reserved.
func (a *volumeActor) claim(ctx actor.Context, msg *claimRequest) {
	a.mirrored = false
	if a.rec == nil {
		answer(msg.reply, reply{err: a.notFound()})
		return
	}
	if a.ephemeralClaim(msg) {
		return
	}
	i, err := claim.Admit(a.rec, msg.req)
	if err != nil {
		answer(msg.reply, reply{err: err})
		return
	}
	if i >= 0 {
		a.join(msg, a.rec.Claims[i].Alloc)
		a.settle(ctx)
		return
	}
	alloc := msg.req.Alloc
	if w := a.allocs[alloc]; w != nil && w.lookup != nil {
		w.lookupReqs = append(w.lookupReqs, msg)
		return
	}
	if cp, ok := a.m.plugins.(claim.CachedPlugins); ok {
		if _, facts, hit := cp.CachedClient(a.rec.Plugin, claim.NodePlugin); hit {
			a.reserveAll(ctx, alloc, []*claimRequest{msg}, facts, nil)
			return
		}
	}
	plugins, plugin := a.m.plugins, a.rec.Plugin
	w := a.work(alloc)
	w.lookup = claim.StartJob(a.m.pool.pool, ctx.ActorSystem().Root, ctx.Self(), func(jctx context.Context) any {
		_, facts, err := plugins.Client(jctx, plugin, claim.NodePlugin)
		return &factsResolved{owner: a, alloc: alloc, facts: facts, err: err}
	})
	w.lookupReqs = []*claimRequest{msg}
	a.settle(ctx)
}

// join answers msg with alloc's claim if it is published and the host has
// its volume, or adds it to the claim's waiters: a claim not published yet,
// or one the host was found missing, which is then sent back through its
// publish steps (the caller's settle starts them).
func (a *volumeActor) join(msg *claimRequest, alloc string) {
	c := &a.rec.Claims[claim.FindClaim(a.rec.Claims, alloc)]
	if c.State == claim.StatePublished && a.m.cfg.Host == nil {
		answer(msg.reply, reply{vol: a.rec, claim: *c})
		return
	}
	w := a.work(alloc)
	w.waiters = append(w.waiters, msg.reply)
	if c.State == claim.StatePublished {
		// Checked when the slot is free: no publish step is in flight
		// then that the check could race with.
		a.queue = append(a.queue, &recheckWork{alloc: alloc})
	}
}

// reserve records the claims whose node plugin lookup finished, checking
// the limits again against the record as it is now.
func (a *volumeActor) reserve(ctx actor.Context, msg *factsResolved) {
	if msg.owner != a {
		return
	}
	w := a.allocs[msg.alloc]
	if w == nil || w.lookup == nil {
		return
	}
	reqs := w.lookupReqs
	w.lookup.Stop()
	w.lookup, w.lookupReqs = nil, nil
	a.tidy(msg.alloc)
	a.reserveAll(ctx, msg.alloc, reqs, msg.facts, msg.err)
}

// reserveAll records alloc's claim for the first of reqs that the limits
// allow, given the node plugin's facts (or the error of looking them up),
// and answers or queues every request.
func (a *volumeActor) reserveAll(ctx actor.Context, alloc string, reqs []*claimRequest, facts claim.Facts, lookupErr error) {
	for _, req := range reqs {
		if a.rec == nil {
			answer(req.reply, reply{err: a.notFound()})
			continue
		}
		if lookupErr != nil {
			answer(req.reply, reply{err: kinderr.Errorf(ErrPluginUnavailable, "%w", lookupErr)})
			continue
		}
		i, err := claim.Admit(a.rec, req.req)
		if err != nil {
			answer(req.reply, reply{err: err})
			continue
		}
		if i >= 0 {
			a.join(req, a.rec.Claims[i].Alloc)
			continue
		}
		if _, err := secretsOf(a.rec); err != nil {
			answer(req.reply, reply{err: err})
			continue
		}
		if err := a.admitHere(facts); err != nil {
			answer(req.reply, reply{err: err})
			continue
		}
		if err := a.admitHosts(req.req, facts); err != nil {
			a.m.noteUse(a.rec) // gives back the node slot admitHere took
			answer(req.reply, reply{err: err})
			continue
		}
		v := claim.CloneVolume(a.rec)
		claim.Reserve(v, req.req, facts, a.m.cfg.DataDir, time.Now())
		if err := a.persist(v, "reserve"); err != nil {
			if a.m.cfg.Arbiter != nil {
				a.m.cfg.Arbiter.Free(a.h.id, alloc)
			}
			a.m.noteUse(a.rec) // gives back the node slot admitHere took
			answer(req.reply, reply{err: err})
			continue
		}
		w := a.work(alloc)
		w.waiters = append(w.waiters, req.reply)
		a.queue = append(a.queue, &advanceWork{alloc: alloc})
	}
	a.settle(ctx)
}

// advance starts the next publish step of alloc's claim, or answers its
// waiters when it is published. The slot is free.
func (a *volumeActor) advance(ctx actor.Context, alloc string) {
	if a.rec == nil {
		return
	}
	if w := a.allocs[alloc]; w != nil && w.retry != nil {
		return // retryDue queues it again
	}
	step, ok := claim.NextPublish(a.rec, alloc)
	if !ok {
		if a.rec.NodeExpandPending > 0 && a.expandOnPublish(ctx, alloc) {
			return
		}
		a.answerPublished(alloc)
		return
	}
	a.slot = slot{kind: slotPublish, alloc: alloc}
	host := a.m.cfg.Host
	a.slot.job = a.m.runner.StartStep(a.m.pool.pool, ctx.ActorSystem().Root, ctx.Self(), step, func(res claim.Result) any {
		msg := &stepFinished{owner: a, step: step, res: res}
		if step.Method == claim.NodeStage && res.OK() && host != nil {
			// Looked at here, in the step's goroutine: the mount table
			// is read from the kernel.
			lctx, cancel := context.WithTimeout(context.Background(), hostLookTimeout)
			if view, err := host.Look(lctx); err == nil {
				msg.stagingMounted = view.Mounted(step.StagingPath)
			}
			cancel()
		}
		return msg
	})
}

func (a *volumeActor) answerPublished(alloc string) {
	i := claim.FindClaim(a.rec.Claims, alloc)
	if i < 0 || a.rec.Claims[i].State != claim.StatePublished {
		return
	}
	a.answerWaiters(alloc, reply{vol: a.rec, claim: a.rec.Claims[i]})
}

// answerWaiters answers the callers of alloc's claim with r.
func (a *volumeActor) answerWaiters(alloc string, r reply) {
	if w := a.allocs[alloc]; w != nil {
		answerAll(w.waiters, r)
		w.waiters = nil
		a.tidy(alloc)
	}
}

func (a *volumeActor) stepFinished(ctx actor.Context, msg *stepFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	alloc := msg.step.Alloc
	if a.rec == nil || claim.FindClaim(a.rec.Claims, alloc) < 0 {
		// Released while the step ran: the claim's teardown assumes the
		// step may have taken effect.
		a.settle(ctx)
		return
	}
	now := time.Now()
	// A repair is of a claim its allocation holds and uses: it is never
	// given up and torn down, only retried, showing its last error.
	repair := a.rec.Claims[claim.FindClaim(a.rec.Claims, alloc)].Repair
	switch {
	case msg.res.Outcome == csi.Success:
		v := claim.CloneVolume(a.rec)
		claim.ApplyPublish(v, msg.step, msg.res, now)
		if j := claim.FindStaging(v, msg.step.StagingPath); msg.step.Method == claim.NodeStage && j >= 0 {
			v.Stagings[j].Mounted = msg.stagingMounted
		}
		if c := v.Claims[claim.FindClaim(v.Claims, alloc)]; c.State == claim.StatePublished {
			a.mustPersist(v, msg.step.Method.String()) // the outcome its caller hears
		} else {
			a.persistStep(v, msg.step.Method.String())
		}
		if msg.res.Unmounted != "" {
			a.m.broken.unmounted(a.h.id, alloc, msg.step.Method.String())
		}
		if repair != "" && msg.step.Method == claim.NodePublish {
			a.m.repairs.WithLabelValues(a.rec.Plugin, repairSucceeded).Inc()
			a.log.WithFields(logrus.Fields{"alloc": alloc, "missing": repair}).Info("claim repaired: published again")
			if ev, ok := a.m.broken.healed(a.rec.Plugin, a.h.id, alloc, now); ok && a.m.cfg.OnEvent != nil {
				a.m.cfg.OnEvent(ev)
			}
		}
		a.queue = append(a.queue, &advanceWork{alloc: alloc})
	case msg.res.Outcome == csi.Final && repair == "":
		a.failClaim(ctx, msg.step, msg.res.Err)
	default:
		v := claim.CloneVolume(a.rec)
		n := claim.RecordFailure(v.Claims, alloc, msg.res.Err.Error(), now)
		if msg.step.Method == claim.NodePublish && n == 1 && csi.Code(msg.res.Err) == codes.FailedPrecondition {
			// The plugin may have lost the staging the record
			// believes in: stage it again, once; a NodePublishVolume
			// that fails again after that backs off as any other.
			claim.Unstaged(v, alloc)
		}
		a.persistStep(v, "failure")
		if repair != "" {
			a.m.repairs.WithLabelValues(a.rec.Plugin, repairFailed).Inc()
			a.scheduleRetry(ctx, msg.step, n)
			break
		}
		if limit := a.m.cfg.MaxClaimAttempts; limit > 0 && n >= limit {
			a.failClaim(ctx, msg.step, fmt.Errorf("gave up after %d attempts: %w", n, msg.res.Err))
			break
		}
		a.scheduleRetry(ctx, msg.step, n)
	}
	a.settle(ctx)
}

func (a *volumeActor) scheduleRetry(ctx actor.Context, step claim.Step, attempts int) {
	delay := a.m.cfg.Backoff.Delay(attempts - 1)
	alloc := step.Alloc
	a.m.runner.Retrying(step.Plugin, step.Method.String())
	a.log.WithFields(logrus.Fields{"alloc": alloc, "method": step.Method.String(), "attempt": attempts, "delay": delay}).
		Info("publish step failed; retrying with backoff")
	a.work(alloc).retry = a.pauseThen(ctx, step.Plugin, step.Method.PluginType(), delay, &retryDue{owner: a, alloc: alloc})
}

func (a *volumeActor) retryDue(ctx actor.Context, msg *retryDue) {
	if msg.owner != a {
		return
	}
	if w := a.allocs[msg.alloc]; w != nil && w.retry != nil {
		w.retry.Stop()
		w.retry = nil
		a.tidy(msg.alloc)
		a.queue = append(a.queue, &advanceWork{alloc: msg.alloc})
	}
	a.settle(ctx)
}

// failClaim turns a claim whose publish failed for good into a past claim,
// answers its waiters with the error, and starts its teardown.
func (a *volumeActor) failClaim(ctx actor.Context, step claim.Step, cause error) {
	alloc := step.Alloc
	v := claim.CloneVolume(a.rec)
	if _, ok := claim.Retire(v, alloc, cause.Error(), time.Now()); !ok {
		return
	}
	a.mustPersist(v, "fail")
	err := kinderr.Errorf(ErrClaimFailed, "claim of alloc %q on volume %q failed at %s: %w", alloc, a.h.id, step.Method, cause)
	a.log.WithError(cause).WithFields(logrus.Fields{"alloc": alloc, "method": step.Method.String()}).
		Error("claim failed; tearing it down")
	a.endPublish(alloc, reply{err: err})
	a.spawnClaimer(ctx, alloc)
}

// endPublish ends the publish side of alloc's claim, which has just become
// a past claim (released, or failed for good): its retry stops, and its
// callers are answered with r.
func (a *volumeActor) endPublish(alloc string, r reply) {
	w := a.allocs[alloc]
	if w == nil {
		return
	}
	w.retry.Stop()
	w.retry, w.expandAttempts = nil, 0
	a.answerWaiters(alloc, r)
}

// releasedEarly is the answer of the callers of alloc's claim when it is
// released before it was published.
func (a *volumeActor) releasedEarly(alloc string) reply {
	return reply{err: kinderr.Errorf(ErrReleased, "the claim of alloc %q on volume %q was released before it was published", alloc, a.h.id)}
}

// release records alloc's claim as a past claim and answers at once; its
// claim actor tears it down.
func (a *volumeActor) release(ctx actor.Context, msg *releaseRequest) {
	if a.rec == nil {
		answer(msg.reply, reply{err: a.notFound()})
		return
	}
	if claim.FindClaim(a.rec.Claims, msg.alloc) >= 0 {
		v := claim.CloneVolume(a.rec)
		c, _ := claim.Retire(v, msg.alloc, "", time.Now())
		if err := a.persist(v, "release"); err != nil {
			answer(msg.reply, reply{err: err})
			return
		}
		a.endPublish(msg.alloc, a.releasedEarly(msg.alloc))
		a.spawnClaimer(ctx, msg.alloc)
		answer(msg.reply, reply{vol: a.rec, claim: c})
		a.settle(ctx)
		return
	}
	if i := claim.FindClaim(a.rec.PastClaims, msg.alloc); i >= 0 {
		answer(msg.reply, reply{vol: a.rec, claim: a.rec.PastClaims[i]})
		return
	}
	answer(msg.reply, reply{err: kinderr.Errorf(ErrNotFound, "alloc %q holds no claim on volume %q", msg.alloc, a.h.id)})
}

func (a *volumeActor) spawnClaimer(ctx actor.Context, alloc string) {
	if w := a.allocs[alloc]; a.stopping || (w != nil && (w.claimer != nil || len(w.forcing) > 0)) {
		return
	}
	props := claim.NewProps(claim.Config{
		Volume:  a.h.id,
		Alloc:   alloc,
		Plugin:  a.rec.Plugin,
		Runner:  a.m.runner,
		Pool:    a.m.pool.pool,
		Backoff: a.m.cfg.Backoff,
		Logger:  a.m.log,
		Hook:    a.m.hook,
	})
	a.work(alloc).claimer = ctx.Spawn(props)
}

func (a *volumeActor) turnRequested(ctx actor.Context, msg *claim.TurnRequest) {
	if a.slot.kind == slotLent && a.slot.alloc == msg.Alloc {
		// The claim actor restarted and lost its turn.
		a.slot = slot{}
	}
	for _, w := range a.queue {
		if t, ok := w.(*turnWork); ok && t.alloc == msg.Alloc {
			a.settle(ctx)
			return
		}
	}
	a.queue = append(a.queue, &turnWork{alloc: msg.Alloc})
	a.settle(ctx)
}

// grantTurn moves alloc's past claim through the transitions that need no
// RPC and lends the slot to its claim actor for the next RPC, or tells it
// the claim is freed. The slot is free.
func (a *volumeActor) grantTurn(ctx actor.Context, alloc string) {
	w := a.allocs[alloc]
	if w == nil || w.claimer == nil || len(w.forcing) > 0 {
		return
	}
	pid := w.claimer
	if a.rec == nil {
		ctx.Send(pid, &claim.Freed{})
		return
	}
	v := claim.CloneVolume(a.rec)
	step, run, changed := claim.AdvanceRelease(v, alloc, time.Now())
	if changed {
		a.persistStep(v, "release-advance")
	}
	a.lend(ctx, pid, step, run)
}

func (a *volumeActor) lend(ctx actor.Context, pid *actor.PID, step claim.Step, run bool) {
	if !run {
		ctx.Send(pid, &claim.Freed{})
		return
	}
	a.slot = slot{kind: slotLent, alloc: step.Alloc}
	ctx.Send(pid, &claim.Turn{Step: step})
}

func (a *volumeActor) releaseStepDone(ctx actor.Context, msg *claim.StepDone) {
	if a.slot.kind != slotLent || a.slot.alloc != msg.Alloc || a.rec == nil {
		return // a turn taken back after its claim actor restarted
	}
	a.slot = slot{}
	now := time.Now()
	v := claim.CloneVolume(a.rec)
	if msg.Result.OK() {
		claim.ApplyRelease(v, msg.Step, now)
		step, run, _ := claim.AdvanceRelease(v, msg.Alloc, now)
		a.persistStep(v, msg.Step.Method.String())
		if w := a.allocs[msg.Alloc]; w != nil && w.claimer != nil {
			a.lend(ctx, w.claimer, step, run)
		}
	} else {
		claim.RecordFailure(v.PastClaims, msg.Alloc, msg.Result.Err.Error(), now)
		a.persistStep(v, "release-failure")
	}
	a.settle(ctx)
}

func (a *volumeActor) childTerminated(ctx actor.Context, msg *actor.Terminated) {
	for alloc, w := range a.allocs {
		if w.claimer == nil || !w.claimer.Equal(msg.Who) {
			continue
		}
		w.claimer = nil
		if a.slot.kind == slotLent && a.slot.alloc == alloc {
			a.slot = slot{}
		}
		if a.stopping || a.rec == nil || claim.FindClaim(a.rec.PastClaims, alloc) < 0 || len(w.forcing) > 0 {
			a.tidy(alloc)
			break
		}
		// Stopped for good by its supervisor with work left: start it
		// again later, after the longest backoff.
		delay := a.m.cfg.Backoff.Delay(1 << 20)
		w.respawn = claim.StartJob(a.m.pool.pool, ctx.ActorSystem().Root, ctx.Self(), func(jctx context.Context) any {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
				return &respawnClaimer{owner: a, alloc: alloc}
			case <-jctx.Done():
				return nil
			}
		})
		break
	}
	a.settle(ctx)
}

func (a *volumeActor) childGaveUp(msg *actorkit.ChildGaveUp) {
	a.log.WithField("child", msg.Child.Id).WithField("failures", msg.Failures).
		Error("claim actor keeps crashing; it will be started again after a backoff")
}

func (a *volumeActor) respawnClaimer(ctx actor.Context, msg *respawnClaimer) {
	if msg.owner != a {
		return
	}
	if w := a.allocs[msg.alloc]; w != nil && w.respawn != nil {
		w.respawn.Stop()
		w.respawn = nil
		a.tidy(msg.alloc)
	}
	if a.rec != nil && claim.FindClaim(a.rec.PastClaims, msg.alloc) >= 0 {
		a.spawnClaimer(ctx, msg.alloc)
	}
	a.settle(ctx)
}

// register handles Register, Create and Mirror. The slot is free.
func (a *volumeActor) register(ctx actor.Context, req *registerRequest) {
	if req.mirror && !a.mirrored {
		a.mirrored = true
		if a.idle != nil { // armed for Config.IdleTimeout
			a.idle.Stop()
			a.idle = nil
		}
	}
	if a.rec != nil {
		switch {
		case a.rec.Ephemeral != "" && !req.mirror:
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict,
				"volume %q is an ephemeral volume (%s): a claim created it and it is deleted when its last claim is freed", a.h.id, a.rec.Ephemeral)})
		case req.mirror:
			a.update(req)
		case req.spec.sameAs(a.rec, req.create):
			answer(req.reply, reply{vol: a.rec})
		case !req.create:
			a.update(req)
		default:
			answer(req.reply, reply{err: kinderr.Errorf(ErrConflict, "volume %q is already registered with a different definition", a.h.id)})
		}
		return
	}
	spec := req.spec
	if req.mirror {
		// Validated by the host that registered it; see Manager.Mirror.
		v := spec.record(time.Now())
		v.AccessibleTopology = cloneTopology(spec.AccessibleTopology)
		v.MutableParameters = maps.Clone(spec.MutableParameters)
		a.record(req, v, "register")
		return
	}
	if !req.create {
		if err := a.m.extConflict(extKey{spec.Plugin, spec.ExternalID}, a.h.id); err != nil {
			answer(req.reply, reply{err: err})
			return
		}
		vreq := spec.validateRequest()
		var err error
		if vreq.Secrets, err = readSecrets(spec.ID, spec.Secrets, spec.SecretsFrom); err != nil {
			answer(req.reply, reply{err: err})
			return
		}
		a.startOp(ctx, req, req.ctx, spec.Plugin, "ValidateVolumeCapabilities", csi.PublishKind, false,
			func(ctx context.Context, c csi.Client) (any, error) {
				return validate(secretfile.WithRef(ctx, spec.SecretsFrom), c, vreq)
			})
		return
	}
	secrets, err := readSecrets(spec.ID, spec.Secrets, spec.SecretsFrom)
	if err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	creq := spec.createRequest()
	creq.Secrets = secrets
	a.startOp(ctx, req, req.ctx, spec.Plugin, "CreateVolume", csi.PublishKind, true, func(ctx context.Context, c csi.Client) (any, error) {
		resp, err := c.CreateVolume(secretfile.WithRef(ctx, spec.SecretsFrom), creq)
		return resp.GetVolume(), err
	})
}

// createRequest is the CreateVolume request for s, named s.ID.
func (s Spec) createRequest() *csipb.CreateVolumeRequest {
	creq := &csipb.CreateVolumeRequest{
		Name:               s.ID,
		Parameters:         s.Parameters,
		Secrets:            s.Secrets,
		VolumeCapabilities: s.csiCapabilities(),
	}
	if s.CapacityBytes > 0 {
		creq.CapacityRange = &csipb.CapacityRange{RequiredBytes: s.CapacityBytes}
	}
	creq.AccessibilityRequirements = topologyRequirement(s.Topology)
	if s.cloneSource != "" {
		creq.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
			Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: s.cloneSource}}}
	}
	if s.snapshotSource != "" {
		creq.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
			Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: s.snapshotSource}}}
	}
	return creq
}

// record persists v, the record of a new volume (registered or created),
// and answers req. The plugin volume is taken in the manager's index
// first, so that two IDs racing for it cannot both get it.
func (a *volumeActor) record(req *registerRequest, v *persistence.Volume, point string) {
	k := keyOf(v)
	if err := a.m.takeExt(k, a.h.id); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	defer func() {
		// Also on a panic: the record was not written, so the plugin
		// volume is not this ID's.
		if a.rec == nil {
			a.m.dropExt(k, a.h.id)
		}
	}()
	if err := a.persist(v, point); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.m.registered(a.h.id, a.rec)
	answer(req.reply, reply{vol: a.rec})
}

// deregister handles Deregister and Delete. The slot is free.
func (a *volumeActor) deregister(ctx actor.Context, req *deregisterRequest) {
	if a.rec == nil {
		answer(req.reply, reply{err: a.notFound()})
		return
	}
	switch n, p := len(a.rec.Claims), len(a.rec.PastClaims); {
	case a.rec.Ephemeral != "":
		answer(req.reply, reply{err: kinderr.Errorf(ErrConflict,
			"volume %q is an ephemeral volume (%s): it is deleted through the controller when its last claim is freed, not deregistered", a.h.id, a.rec.Ephemeral)})
		return
	case n > 0:
		answer(req.reply, reply{err: kinderr.Errorf(ErrInUse, "volume %q is in use: it has %s%s", a.h.id, claimsHeld(n, p), inUseHint(n, p, req.force))})
		return
	case p > 0 && !req.force:
		answer(req.reply, reply{err: kinderr.Errorf(ErrInUse, "volume %q is in use: it has %s%s", a.h.id, claimsHeld(n, p), inUseHint(n, p, req.force))})
		return
	case p > 0:
		a.forceDeregister(ctx, req)
		return
	}
	if req.evict {
		a.evicted = true
		a.remove(ctx, req)
		return
	}
	if !req.delete {
		a.remove(ctx, req)
		return
	}
	secrets, err := secretsOf(a.rec)
	if err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	dreq := &csipb.DeleteVolumeRequest{VolumeId: a.rec.ExternalID, Secrets: maps.Clone(secrets)}
	ref := a.rec.SecretsFrom
	a.startOp(ctx, req, req.ctx, a.rec.Plugin, "DeleteVolume", csi.UnpublishKind, true, func(ctx context.Context, c csi.Client) (any, error) {
		return nil, c.DeleteVolume(secretfile.WithRef(ctx, ref), dreq)
	})
}

// startOp runs a controller call (CreateVolume, DeleteVolume,
// ValidateVolumeCapabilities) in the slot; with retry, it retries
// retryable failures with backoff until the caller's ctx ends. A plugin
// with no usable controller ends the call at once with a result that is
// Unavailable: the caller is waiting, and nothing was sent.
func (a *volumeActor) startOp(ctx actor.Context, req any, callerCtx context.Context, plugin, method string, kind csi.RPCKind,
	retry bool, call func(context.Context, csi.Client) (any, error)) {
	runner, backoff := a.m.runner, a.m.cfg.Backoff
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		octx, cancel := context.WithCancel(jctx)
		defer cancel()
		defer context.AfterFunc(callerCtx, cancel)()
		var out any
		var res claim.Result
		for attempt := 0; ; attempt++ {
			res = runner.Do(octx, plugin, claim.ControllerPlugin, kind, func(ctx context.Context, c csi.Client) error {
				v, err := call(ctx, c)
				out = v
				return err
			})
			if !retry || res.OK() || res.Outcome == csi.Final || res.Unavailable || octx.Err() != nil {
				break
			}
			runner.Retrying(plugin, method)
			if runner.Pause(octx, plugin, claim.ControllerPlugin, backoff.Delay(attempt)) != nil {
				break
			}
		}
		return &opFinished{owner: a, req: req, res: res, out: out}
	})
}

func (a *volumeActor) opFinished(ctx actor.Context, msg *opFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	switch req := msg.req.(type) {
	case *registerRequest:
		if req.create {
			a.created(req, msg)
		} else {
			a.validated(req, msg)
		}
	case *ephemeralOp:
		a.ephemeralFinished(ctx, req, msg)
	case *deregisterRequest:
		if err := opError("DeleteVolume", a.h.id, msg.res); err != nil {
			answer(req.reply, reply{err: err})
			break
		}
		a.remove(ctx, req)
	}
	a.settle(ctx)
}

func (a *volumeActor) created(req *registerRequest, msg *opFinished) {
	if err := opError("CreateVolume", a.h.id, msg.res); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	created, _ := msg.out.(*csipb.Volume)
	if created.GetVolumeId() == "" {
		answer(req.reply, reply{err: kinderr.Errorf(ErrPluginCall, "CreateVolume of volume %q: %w: no volume id", a.h.id, csi.ErrInvalidResponse)})
		return
	}
	v := req.spec.record(time.Now())
	applyCreated(v, created)
	// A plugin volume registered under another ID (the plugin derived the
	// same volume from this name) is refused in record, and left alone:
	// it is the other ID's.
	a.record(req, v, "create")
}

// applyCreated records in v what CreateVolume answered: the plugin's ID,
// context, capacity and accessible topology.
func applyCreated(v *persistence.Volume, created *csipb.Volume) {
	v.ExternalID = created.GetVolumeId()
	v.Created = true
	if vc := created.GetVolumeContext(); len(vc) > 0 {
		if v.Context == nil {
			v.Context = map[string]string{}
		}
		maps.Copy(v.Context, vc)
	}
	if c := created.GetCapacityBytes(); c > 0 {
		v.CapacityBytes = c
	}
	v.AccessibleTopology = nil
	for _, t := range created.GetAccessibleTopology() {
		v.AccessibleTopology = append(v.AccessibleTopology, maps.Clone(t.GetSegments()))
	}
}

func opError(method, id string, res claim.Result) error {
	switch {
	case res.OK():
		return nil
	case res.Unavailable:
		return fmt.Errorf("%s of volume %q: %w", method, id, res.Err)
	}
	return kinderr.Errorf(ErrPluginCall, "%s of volume %q failed: %w", method, id, res.Err)
}

// remove deletes the record, answers, and stops the actor.
func (a *volumeActor) remove(ctx actor.Context, req *deregisterRequest) {
	if err := a.forget(ctx, req.delete, "deregister"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	answer(req.reply, reply{left: req.left})
}

// forget deletes the record (deleted: the volume was deleted through the
// controller), forgets the volume and stops the actor; point is the crash
// point before the record is deleted.
func (a *volumeActor) forget(ctx actor.Context, deleted bool, point string) error {
	a.m.faultPoint("persist:", point, a.h.id)
	if err := a.m.store.DeleteVolume(context.Background(), a.h.id); err != nil {
		return fmt.Errorf("delete volume %q: %w", a.h.id, err)
	}
	if !a.evicted {
		a.m.recordRemoved(a.rec, deleted)
	}
	a.m.stats.forget(a.h.id)
	last := a.rec
	a.rec = nil
	a.h.snap.Store(&snapshot{})
	a.m.removed(a.h, last)
	a.removed = true
	ctx.Stop(ctx.Self())
	return nil
}

// stopWork stops every goroutine the actor owns and waits for them.
func (a *volumeActor) stopWork() {
	a.stopping = true
	if a.idle != nil {
		a.idle.Stop()
		a.idle = nil
	}
	a.slot.job.Stop()
	a.slot.job = nil
	a.expanding.retry.Stop()
	a.expanding.retry = nil
	a.eph.retry.Stop()
	a.eph.retry = nil
	a.modifying.retry.Stop()
	a.modifying.retry = nil
	for alloc, w := range a.allocs {
		w.lookup.Stop()
		w.retry.Stop()
		w.respawn.Stop()
		w.lookup, w.lookupReqs, w.retry, w.respawn = nil, nil, nil, nil
		a.tidy(alloc)
	}
}

// restarting: the supervisor restarts the actor after a crash. Its requests
// in memory are lost; waiters send theirs again to the new incarnation,
// which reloads the record.
func (a *volumeActor) restarting() {
	a.stopWork()
	a.h.incarnationEnded()
}

func (a *volumeActor) stoppingNow() {
	a.stopWork()
	if !a.passivated && !a.removed {
		a.m.detach(a.h)
	}
}

func (a *volumeActor) stopped() {
	if !a.passivated && !a.removed {
		a.m.orphaned(a.h)
	}
	a.h.incarnationEnded()
	close(a.h.stopped)
	a.m.actors.Done()
}
