package claim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"github.com/csiactor/csiactor/internal/secretfile"
)

// DefaultMaxInFlightPerPlugin is the default bound on RPCs in flight to one
// plugin.
const DefaultMaxInFlightPerPlugin = 16

// RunnerConfig configures a Runner. Zero fields mean their defaults.
type RunnerConfig struct {
	// MaxInFlightPerPlugin bounds the RPCs in flight to one plugin (all
	// volumes together), so that many volumes cannot swamp it. Zero means
	// DefaultMaxInFlightPerPlugin.
	MaxInFlightPerPlugin int
	// InFlight, when set, is raised while an RPC is in flight
	// (csiactor_volume_operations_in_flight).
	InFlight prometheus.Gauge
	// Logger receives one line per failed RPC; nil discards.
	Logger *logrus.Entry
	// RetryMetrics, when set, counts every retry of a step or controller
	// call (csiactor_csi_retries_total); see Runner.Retrying.
	RetryMetrics *csi.Metrics
	// StepFailures, when set, counts every claim step that fails
	// (csiactor_claim_step_failures_total {plugin, step, code}; see
	// NewStepFailures).
	StepFailures *prometheus.CounterVec
	// MountProbe, when set, is asked whether the target or staging path
	// of a NodeUnpublishVolume or NodeUnstageVolume that failed is a dead
	// mount (a FUSE mount whose plugin died); the Runner then unmounts it
	// itself and sends the call once more (see Result.Unmounted).
	MountProbe *mountprobe.Prober
}

// Runner sends claim RPCs to plugins. It is safe for concurrent use; every
// volume actor and claim actor of a manager shares one.
type Runner struct {
	plugins  Plugins
	max      int
	inflight prometheus.Gauge
	retries  *csi.Metrics
	failures *prometheus.CounterVec
	log      *logrus.Entry
	probe    *mountprobe.Prober

	mu    sync.Mutex
	gates map[string]*gate // guarded by mu; one per plugin
}

// NewRunner returns a Runner that finds clients through plugins.
func NewRunner(plugins Plugins, cfg RunnerConfig) *Runner {
	if cfg.MaxInFlightPerPlugin <= 0 {
		cfg.MaxInFlightPerPlugin = DefaultMaxInFlightPerPlugin
	}
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.Out = discard{}
		log = logrus.NewEntry(l)
	}
	return &Runner{
		plugins:  plugins,
		max:      cfg.MaxInFlightPerPlugin,
		inflight: cfg.InFlight,
		retries:  cfg.RetryMetrics,
		failures: cfg.StepFailures,
		log:      log,
		probe:    cfg.MountProbe,
		gates:    map[string]*gate{},
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func (r *Runner) gate(plugin string) *gate {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.gates[plugin]
	if !ok {
		g = newGate(r.max)
		r.gates[plugin] = g
	}
	return g
}

// Do takes one of plugin's in-flight places (waiting for one, in turn,
// under ctx), gets the client of plugin and typ, and calls fn with it. The
// result is classified for kind. When no client can be had, the result is
// Unavailable with outcome Retry: nothing was sent.
func (r *Runner) Do(ctx context.Context, plugin string, typ PluginType, kind csi.RPCKind, fn func(context.Context, csi.Client) error) Result {
	return r.holding(ctx, plugin, func() Result { return r.call(ctx, plugin, typ, kind, fn) })
}

// holding runs fn holding one of plugin's in-flight places.
func (r *Runner) holding(ctx context.Context, plugin string, fn func() Result) Result {
	g := r.gate(plugin)
	if err := g.acquire(ctx); err != nil {
		return Result{Err: err, Outcome: csi.Retry, Unavailable: true}
	}
	defer g.release()
	return fn()
}

// call is Do for a caller that holds a place.
func (r *Runner) call(ctx context.Context, plugin string, typ PluginType, kind csi.RPCKind, fn func(context.Context, csi.Client) error) Result {
	return r.callFacts(ctx, plugin, typ, kind, func(ctx context.Context, c csi.Client, _ Facts) error { return fn(ctx, c) })
}

// callFacts is call for a function that needs the plugin's facts too.
func (r *Runner) callFacts(ctx context.Context, plugin string, typ PluginType, kind csi.RPCKind, fn func(context.Context, csi.Client, Facts) error) Result {
	client, facts, err := r.plugins.Client(ctx, plugin, typ)
	if err != nil {
		return Result{Err: kinderr.Errorf(ErrPluginUnavailable, "%w", err), Outcome: csi.Retry, Unavailable: true}
	}
	if r.inflight != nil {
		r.inflight.Inc()
		defer r.inflight.Dec()
	}
	err = fn(ctx, client, facts)
	return Result{Err: err, Outcome: csi.Classify(kind, err)}
}

// StartStep runs s as Run does, in a job of pid's (see StartJob), and sends
// pid what msg makes of the result. While the plugin has no free in-flight
// place the job waits in line without a goroutine of its own; Stop takes it
// out of the line. The place is given back before the message is sent.
func (r *Runner) StartStep(pool *Pool, root *actor.RootContext, pid *actor.PID, s Step, msg func(Result) any) *Job {
	g := r.gate(s.Plugin)
	j, run := newJob(root, pid, func(ctx context.Context) any {
		defer g.release()
		if ctx.Err() != nil {
			return nil // stopped as it got its place
		}
		return msg(r.step(ctx, s))
	})
	j.start = func() { goOn(pool, run) }
	if g.admit(j) {
		j.start()
	}
	return j
}

// Run sends s to its plugin and returns the classified result. It creates
// the staging directory before NodeStageVolume and the target's parent
// before NodePublishVolume (the CO's job, by the CSI spec), and removes them
// when empty after a successful unpublish or unstage.
func (r *Runner) Run(ctx context.Context, s Step) Result {
	return r.holding(ctx, s.Plugin, func() Result { return r.step(ctx, s) })
}

// step is Run for a caller that holds a place.
func (r *Runner) step(ctx context.Context, s Step) Result {
	var pubCtx map[string]string
	if s.SecretsFrom != "" && s.Method != NodeUnpublish && s.Method != NodeUnstage {
		// Read now, for this RPC: a replaced file rotates the secrets.
		// Unreadable, the RPC is not sent and the step is retried.
		secrets, err := secretfile.Read(s.SecretsFrom)
		if err != nil {
			res := Result{Err: fmt.Errorf("volume %q: secrets_from.file: %w", s.Volume, err), Outcome: csi.Retry}
			r.log.WithError(res.Err).WithFields(logrus.Fields{
				"plugin": s.Plugin, "volume": s.Volume, "alloc": s.Alloc, "method": s.Method.String(),
			}).Warn("claim step not sent")
			return res
		}
		s.Secrets = secrets
		ctx = secretfile.WithRef(ctx, s.SecretsFrom)
	}
	ctx = WithStep(ctx, s)
	send := func() Result {
		return r.callFacts(ctx, s.Plugin, s.Method.PluginType(), s.Method.Kind(), r.stepCall(s, &pubCtx))
	}
	res := send()
	if !res.OK() && !res.Unavailable && ctx.Err() == nil {
		if cause := r.unmountDead(ctx, s, res.Err); cause != "" {
			res = send()
			res.Unmounted = cause
		}
	}
	res.PublishContext = pubCtx
	if s.Method == ControllerPublish && csi.Code(res.Err) == codes.ResourceExhausted {
		if rf, ok := r.plugins.(Refingerprinter); ok {
			rf.Refingerprint(s.Plugin)
		}
	}
	if res.OK() {
		switch s.Method {
		case NodeUnpublish:
			// The plugin removes what it made at the target; the
			// per-alloc directories are ours. Remove fails on a
			// directory that is not empty, which is what we want.
			r.removeLeftMount(s, s.TargetPath, res.Err)
			_ = os.Remove(filepath.Dir(s.TargetPath))
			_ = os.Remove(filepath.Dir(filepath.Dir(s.TargetPath)))
		case NodeUnstage:
			r.removeLeftMount(s, s.StagingPath, res.Err)
			_ = os.Remove(filepath.Dir(s.StagingPath))
		}
	} else {
		if ctx.Err() == nil { // a step stopped by its owner did not fail
			r.countFailure(s, res)
		}
		r.log.WithError(res.Err).WithFields(logrus.Fields{
			"plugin": s.Plugin, "volume": s.Volume, "alloc": s.Alloc,
			"method": s.Method.String(), "outcome": res.Outcome.String(),
		}).Warn("claim step failed")
	}
	return res
}

// stepCall is the RPC of claim step s; a ControllerPublishVolume's
// publish context goes to pubCtx.
func (r *Runner) stepCall(s Step, pubCtx *map[string]string) func(context.Context, csi.Client, Facts) error {
	return func(ctx context.Context, c csi.Client, f Facts) error {
		// A mount group goes to a plugin with VOLUME_MOUNT_GROUP;
		// otherwise the agent applies it after NodePublishVolume.
		ownGroup := s.MountGroup != "" && !f.VolumeMountGroup
		if s.MountGroup != "" && f.VolumeMountGroup {
			s.Capability = withMountGroup(s.Capability, s.MountGroup)
		}
		switch s.Method {
		case ControllerPublish:
			resp, err := c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
				VolumeId:         s.ExternalID,
				NodeId:           s.NodeID,
				VolumeCapability: s.Capability.ToCSI(),
				Readonly:         s.Readonly,
				Secrets:          s.Secrets,
				VolumeContext:    s.VolumeContext,
			})
			if err == nil {
				*pubCtx = resp.GetPublishContext()
			}
			return err
		case NodeStage:
			if err := mkdirAll(s.StagingPath); err != nil {
				return fmt.Errorf("create staging directory: %w", err)
			}
			return c.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
				VolumeId:          s.ExternalID,
				PublishContext:    s.PublishContext,
				StagingTargetPath: s.StagingPath,
				VolumeCapability:  s.Capability.ToCSI(),
				Secrets:           s.Secrets,
				VolumeContext:     s.VolumeContext,
			})
		case NodePublish:
			if err := mkdirAll(filepath.Dir(s.TargetPath)); err != nil {
				return fmt.Errorf("create target parent directory: %w", err)
			}
			err := c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
				VolumeId:          s.ExternalID,
				PublishContext:    s.PublishContext,
				StagingTargetPath: s.StagingPath,
				TargetPath:        s.TargetPath,
				VolumeCapability:  s.Capability.ToCSI(),
				Readonly:          s.Readonly,
				Secrets:           s.Secrets,
				VolumeContext:     s.VolumeContext,
			})
			if err == nil && ownGroup {
				err = applyClaimGroup(s)
			}
			return err
		case NodeUnpublish:
			return c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{
				VolumeId:   s.ExternalID,
				TargetPath: s.TargetPath,
			})
		case NodeUnstage:
			return c.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{
				VolumeId:          s.ExternalID,
				StagingTargetPath: s.StagingPath,
			})
		case ControllerUnpublish:
			return c.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{
				VolumeId: s.ExternalID,
				NodeId:   s.NodeID,
				Secrets:  s.Secrets,
			})
		}
		return fmt.Errorf("%w: unknown claim step %s", ErrInvalid, s.Method)
	}
}

// removeLeftMount removes path, the target or staging of an unpublish or
// unstage that the plugin answered as done (err is a NotFound taken as
// done, or nil). A path the plugin left mounted (EBUSY) is unmounted
// first: a plugin killed between its mount and its own record of it
// answers NotFound after its restart and never unmounts it, and the path
// is the agent's, which nothing else will clean.
func (r *Runner) removeLeftMount(s Step, path string, err error) {
	rerr := os.Remove(path)
	if !errors.Is(rerr, syscall.EBUSY) {
		return
	}
	log := r.log.WithFields(logrus.Fields{
		"plugin": s.Plugin, "volume": s.Volume, "alloc": s.Alloc, "method": s.Method.String(), "path": path,
	})
	if err != nil {
		log = log.WithField("answer", err.Error())
	}
	// Mounts may be stacked there (a publish repeated by a plugin that
	// lost its record): one unmount each, a few at most.
	for range maxLeftMounts {
		if uerr := mountprobe.Unmount(path); uerr != nil {
			log.WithField("unmount_error", uerr.Error()).Warn("the plugin answered done but left the path mounted, and the agent could not unmount it")
			return
		}
		log.Warn("the plugin answered done but left the path mounted; the agent unmounted it")
		if !errors.Is(os.Remove(path), syscall.EBUSY) {
			return
		}
	}
}

// maxLeftMounts bounds the unmounts of removeLeftMount at one path.
const maxLeftMounts = 4

// unmountDead handles a NodeUnpublishVolume or NodeUnstageVolume that
// failed with err: when its path is a dead mount (see mountprobe), the
// plugin may be unable to take it down (a FUSE driver whose process died
// with the mount, restarted), so the agent unmounts it itself, says so,
// and returns the probe's cause; the caller then sends the call again, for
// the plugin to forget it. Otherwise it returns "".
func (r *Runner) unmountDead(ctx context.Context, s Step, err error) string {
	var path string
	switch s.Method {
	case NodeUnpublish:
		path = s.TargetPath
	case NodeUnstage:
		path = s.StagingPath
	default:
		return ""
	}
	if r.probe == nil || path == "" {
		return ""
	}
	pr := r.probe.One(ctx, path)
	if !pr.Broken() {
		return ""
	}
	log := r.log.WithError(err).WithFields(logrus.Fields{
		"plugin": s.Plugin, "volume": s.Volume, "alloc": s.Alloc, "method": s.Method.String(), "path": path, "cause": pr.Cause,
	})
	if uerr := mountprobe.Unmount(path); uerr != nil {
		log.WithField("unmount_error", uerr.Error()).Warn("the plugin failed on a dead mount, and the agent could not unmount it either")
		return ""
	}
	log.Warn("the plugin failed on a dead mount; the agent unmounted it and asks the plugin again")
	return pr.Cause
}

// Retrying counts one retry of method (a CSI method name) on plugin: the
// caller is about to Pause and try it again.
func (r *Runner) Retrying(plugin, method string) { r.retries.Retried(plugin, method) }

// Pause waits d, then until plugin and typ have a healthy allocation, so a
// retry neither spins nor fires at a plugin that is down. It returns early
// with ctx's error when ctx ends.
func (r *Runner) Pause(ctx context.Context, plugin string, typ PluginType, d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if err := r.plugins.WaitHealthy(ctx, plugin, typ); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// mkdirAll is os.MkdirAll (mode 0750) that tolerates a concurrent removal
// of an empty parent: the teardown of another volume of the same
// allocation removes per-alloc/<alloc> once it is empty, which may happen
// between MkdirAll's mkdir of the parent and that of the child (it then
// fails with ENOENT). Each removal needs a teardown, so a few tries do.
func mkdirAll(dir string) error {
	var err error
	for range 8 {
		if err = os.MkdirAll(dir, 0o750); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}
