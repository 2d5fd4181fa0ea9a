package claim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
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
	client, _, err := r.plugins.Client(ctx, plugin, typ)
	if err != nil {
		return Result{Err: kinderr.Errorf(ErrPluginUnavailable, "%w", err), Outcome: csi.Retry, Unavailable: true}
	}
	if r.inflight != nil {
		r.inflight.Inc()
		defer r.inflight.Dec()
	}
	err = fn(ctx, client)
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
	res := r.call(ctx, s.Plugin, s.Method.PluginType(), s.Method.Kind(), func(ctx context.Context, c csi.Client) error {
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
				pubCtx = resp.GetPublishContext()
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
			return c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
				VolumeId:          s.ExternalID,
				PublishContext:    s.PublishContext,
				StagingTargetPath: s.StagingPath,
				TargetPath:        s.TargetPath,
				VolumeCapability:  s.Capability.ToCSI(),
				Readonly:          s.Readonly,
				Secrets:           s.Secrets,
				VolumeContext:     s.VolumeContext,
			})
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
	})
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
			_ = os.Remove(s.TargetPath)
			_ = os.Remove(filepath.Dir(s.TargetPath))
			_ = os.Remove(filepath.Dir(filepath.Dir(s.TargetPath)))
		case NodeUnstage:
			_ = os.Remove(s.StagingPath)
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
