package volume

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/persistence"
)

// Host looks at what the host has mounted, for the host checks of claims
// (see Manager.Reconcile).
type Host interface {
	// Look takes a picture of the host's mounts; it may block on reading
	// the mount table. The view is never changed after Look returns it,
	// so volume actors share it.
	Look(ctx context.Context) (claim.HostView, error)
}

// MountTable is the Host of a Linux host: the mount table of the agent's
// mount namespace, and symlinks on the file system.
type MountTable struct {
	// File is the mount table to read; empty means /proc/self/mountinfo.
	File string
	// Dir keeps the mount points at or below it (the volumes directory);
	// empty keeps every one.
	Dir string
}

// Look implements Host.
func (t MountTable) Look(context.Context) (claim.HostView, error) {
	tb, err := mountinfo.Read(t.File, t.Dir)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return tableView{tb}, nil
}

type tableView struct{ t *mountinfo.Table }

func (v tableView) Mounted(path string) bool { return v.t.Has(path) }

func (tableView) Linked(path string) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return false
	}
	fi, err = os.Stat(path)
	return err == nil && fi.IsDir()
}

// ReconcileOptions says what Manager.Reconcile checks.
type ReconcileOptions struct {
	// Plugin, when set, limits the check to this plugin's volumes (its
	// node allocation came back: its mounts may have died with it).
	Plugin string
}

// ReconcileResult counts what a host check did.
type ReconcileResult struct {
	// Volumes is the number of volumes whose claims were sent back through
	// their publish steps; Claims the number of those claims.
	Volumes, Claims int
}

// reconcileWorkers bounds the volumes a host check writes or waits on at
// once.
const reconcileWorkers = 32

// Reconcile compares the claims of the registered volumes with the host
// (see claim.CheckHost): a published claim whose target path or staging
// path is not mounted (or, in a plugin's symlink mode, linked) goes back
// through NodeStageVolume and NodePublishVolume, marked with what was
// missing. It returns once each such claim is recorded as repairing; the
// repairs run on in the background, each retried with backoff until it
// succeeds (a failing repair shows its last error; see Claim.Condition).
// The claim-repaired event and csiactor_claim_repairs_total report them.
// Start does the same for every volume before it resumes anything.
//
// Without Config.Host, Reconcile does nothing.
func (m *Manager) Reconcile(ctx context.Context, opts ReconcileOptions) (ReconcileResult, error) {
	m.mu.Lock()
	closed, started := m.closed, m.started
	m.mu.Unlock()
	switch {
	case closed:
		return ReconcileResult{}, ErrShutdown
	case !started:
		return ReconcileResult{}, fmt.Errorf("%w: manager not started", ErrInvalid)
	case m.cfg.Host == nil:
		return ReconcileResult{}, nil
	}
	asOf := time.Now()
	view, err := m.cfg.Host.Look(ctx)
	if err != nil {
		return ReconcileResult{}, err
	}
	// The walk decides on stored records which volumes to ask; each
	// volume actor decides again on its own record.
	var claimed []*persistence.Volume
	err = m.store.ForEachVolume(ctx, func(v persistence.Volume) error {
		if len(v.Claims) == 0 || (opts.Plugin != "" && v.Plugin != opts.Plugin) {
			return nil
		}
		claimed = append(claimed, claim.CloneVolume(&v))
		return nil
	})
	if err != nil {
		return ReconcileResult{}, fmt.Errorf("check claims against the host: %w", err)
	}
	if m.cfg.MountProbe != nil {
		m.broken.seen(opts.Plugin)
		view = m.probeMounts(ctx, view, claimed, opts.Plugin)
	}
	var ids []string
	for _, v := range claimed {
		if _, changed := claim.CheckHost(v, view, false, asOf, asOf); changed {
			ids = append(ids, strings.Clone(v.ID))
		}
	}
	res, err := forEachParallel(ctx, ids, func(id string) (int, error) {
		r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
			return &reconcileRequest{view: view, asOf: asOf, reply: ch}
		})
		if err == nil {
			err = r.err
		}
		return r.repaired, err
	})
	if res.Claims > 0 {
		m.log.WithFields(logrus.Fields{"volumes": res.Volumes, "claims": res.Claims, "plugin": opts.Plugin}).
			Warn("claims the host is missing are being published again")
	}
	return res, err
}

// forEachParallel calls fn for each of ids on at most reconcileWorkers
// goroutines, which it waits for, and adds up the claims fn reports.
func forEachParallel(ctx context.Context, ids []string, fn func(id string) (int, error)) (ReconcileResult, error) {
	var (
		mu   sync.Mutex
		res  ReconcileResult
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan string)
	for range min(reconcileWorkers, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				n, err := fn(id)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("volume %q: %w", id, err))
				} else if n > 0 {
					res.Volumes++
					res.Claims += n
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, id := range ids {
		select {
		case next <- id:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		return res, fmt.Errorf("%d of %d volumes: %w", len(errs), len(ids), errs[0])
	}
	return res, ctx.Err()
}

// probedView is a host view whose mount points were probed: one that is
// in the mount table but dead is not Mounted, and Broken says why (see
// claim.BrokenView).
type probedView struct {
	claim.HostView
	broken map[string]string // path → cause
}

func (v probedView) Mounted(path string) bool {
	return v.broken[path] == "" && v.HostView.Mounted(path)
}

// Linked is false for a dead mount point without looking at it: a stat of
// a hung mount would hang the caller (a volume actor).
func (v probedView) Linked(path string) bool {
	return v.broken[path] == "" && v.HostView.Linked(path)
}

func (v probedView) Broken(path string) string { return v.broken[path] }

// probeMounts probes the mount points of vols that CheckHost would trust
// (the targets of published claims and the mounted stagings that view
// lists) and returns view with the dead ones taken out. It also forgets,
// in the book of dead mounts, the claims of plugin that are no longer
// being repaired for one.
func (m *Manager) probeMounts(ctx context.Context, view claim.HostView, vols []*persistence.Volume, plugin string) claim.HostView {
	still := map[brokenKey]struct{}{}
	for _, v := range vols {
		m.broken.seen(v.Plugin)
		for i := range v.Claims {
			if c := &v.Claims[i]; claim.BrokenCause(c.Repair) != "" {
				still[brokenKey{v.ID, c.Alloc}] = struct{}{}
			}
		}
	}
	m.broken.prune(plugin, still)
	return m.probe(ctx, view, vols)
}

// probe probes the mount points of vols that CheckHost would trust (the
// targets of published claims and the mounted stagings that view lists)
// and returns view with the dead ones taken out.
func (m *Manager) probe(ctx context.Context, view claim.HostView, vols []*persistence.Volume) claim.HostView {
	var paths []string
	pluginOf := map[string]string{} // path → plugin
	for _, v := range vols {
		for i := range v.Claims {
			c := &v.Claims[i]
			if c.State == claim.StatePublished && view.Mounted(c.TargetPath) {
				paths = append(paths, c.TargetPath)
				pluginOf[c.TargetPath] = v.Plugin
			}
		}
		for i := range v.Stagings {
			if st := &v.Stagings[i]; st.Staged && st.Mounted && view.Mounted(st.Path) {
				paths = append(paths, st.Path)
				pluginOf[st.Path] = v.Plugin
			}
		}
	}
	if len(paths) == 0 {
		return view
	}
	broken := map[string]string{}
	for path, r := range m.cfg.MountProbe.Probe(ctx, paths) {
		m.broken.probed(pluginOf[path], r)
		if r.Broken() {
			broken[path] = r.Cause
		}
	}
	if len(broken) == 0 {
		return view
	}
	for path, cause := range broken {
		m.log.WithFields(logrus.Fields{"plugin": pluginOf[path], "path": path, "cause": cause}).
			Warn("a mount point in the mount table is dead; its claims are published again")
	}
	return probedView{HostView: view, broken: broken}
}

// noHost is the view of a check that trusts nothing on the host (after a
// reboot): nothing is mounted.
type noHost struct{}

func (noHost) Mounted(string) bool { return false }
func (noHost) Linked(string) bool  { return false }

// checkHost runs on the volume actor when its slot is free (no publish
// step in flight could race with the check): it sends the
// claims the host is missing back through their publish steps (persisted
// first) and queues them. It returns how many claims it sent back.
func (a *volumeActor) checkHost(view claim.HostView, asOf time.Time) (int, error) {
	if a.rec == nil {
		return 0, nil
	}
	v := claim.CloneVolume(a.rec)
	now := time.Now()
	allocs, changed := claim.CheckHost(v, view, false, asOf, now)
	if !changed {
		return 0, nil
	}
	if err := a.persist(v, "repair"); err != nil {
		return 0, err
	}
	evs := a.m.broken.found(v, allocs, now)
	if emit := a.m.cfg.OnEvent; emit != nil {
		for _, ev := range evs {
			emit(ev)
		}
	}
	for _, alloc := range allocs {
		c := a.rec.Claims[claim.FindClaim(a.rec.Claims, alloc)]
		a.log.WithFields(logrus.Fields{"alloc": alloc, "missing": c.Repair, "target": c.TargetPath}).
			Warn("the host is missing a published claim's volume; publishing it again")
		a.queue = append(a.queue, &advanceWork{alloc: alloc})
	}
	return len(allocs), nil
}

// reconcile handles a reconcileRequest. The slot is free.
func (a *volumeActor) reconcile(req *reconcileRequest) {
	n, err := a.checkHost(req.view, req.asOf)
	answer(req.reply, reply{vol: a.rec, repaired: n, err: err})
}

// startRecheck runs a recheckWork: it looks at the host for a repeated
// claim of alloc, which the record says is published, in a job that holds
// the slot (so no publish step runs meanwhile), probing the volume's
// mounts when the manager has a MountProbe: a stat of a hung mount waits
// there, never on the actor. rechecked takes it from there. The slot is
// free.
func (a *volumeActor) startRecheck(ctx actor.Context, alloc string) {
	if a.rec == nil || claim.FindClaim(a.rec.Claims, alloc) < 0 {
		return // released or deregistered meanwhile; its waiters were answered
	}
	if a.m.cfg.Host == nil {
		a.answerPublished(alloc)
		return
	}
	m, vols := a.m, []*persistence.Volume{claim.CloneVolume(a.rec)}
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		lctx, cancel := context.WithTimeout(jctx, hostLookTimeout)
		defer cancel()
		view, err := m.cfg.Host.Look(lctx)
		if err == nil && m.cfg.MountProbe != nil {
			view = m.probe(lctx, view, vols)
		}
		if jctx.Err() != nil {
			return nil // stopping
		}
		return &recheckLooked{owner: a, alloc: alloc, view: view, err: err}
	})
}

// rechecked handles a recheckLooked: it answers alloc's waiters with the
// claim when the host has its volume, or sends the claims the host is
// missing back through their publish steps and leaves alloc's waiters
// waiting for the repair. A host that could not be looked at leaves the
// record as it is.
func (a *volumeActor) rechecked(ctx actor.Context, msg *recheckLooked) {
	if msg.owner != a {
		return
	}
	a.vacate()
	defer a.settle(ctx)
	if a.rec == nil || claim.FindClaim(a.rec.Claims, msg.alloc) < 0 {
		return // released or deregistered meanwhile; its waiters were answered
	}
	if msg.err != nil {
		a.log.WithError(msg.err).WithField("alloc", msg.alloc).Warn("cannot check the host for a repeated claim; answering from the record")
		a.answerPublished(msg.alloc)
		return
	}
	// The slot was held since the look: nothing was published after it.
	if _, err := a.checkHost(msg.view, time.Now().Add(time.Nanosecond)); err != nil {
		a.answerWaiters(msg.alloc, reply{err: err})
		return
	}
	if i := claim.FindClaim(a.rec.Claims, msg.alloc); i >= 0 && a.rec.Claims[i].State == claim.StatePublished {
		a.answerPublished(msg.alloc)
	}
}

// hostLookTimeout is how long a repeated claim may wait for the host check of
// its published claim.
const hostLookTimeout = 10 * time.Second
