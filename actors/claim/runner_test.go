package claim

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// stubPlugins is a hand-written Plugins over one client.
type stubPlugins struct {
	client csi.Client
	down   atomic.Bool
	calls  atomic.Int64
	// cur and max count NodeStageVolume calls in flight.
	cur, max atomic.Int64
	// staged are the volumes of the NodeStageVolume calls, in the order
	// they were sent; guarded by mu.
	mu     sync.Mutex
	staged []string
}

func (p *stubPlugins) stagedOrder() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.staged)
}

func (p *stubPlugins) Client(context.Context, string, PluginType) (csi.Client, Facts, error) {
	p.calls.Add(1)
	if p.down.Load() {
		return nil, Facts{}, errors.New("down")
	}
	return &countingClient{Client: p.client, p: p}, Facts{NodeID: fakeplugin.DefaultNodeID, StageUnstage: true}, nil
}

func (p *stubPlugins) WaitHealthy(ctx context.Context, _ string, _ PluginType) error {
	for p.down.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

type countingClient struct {
	csi.Client
	p *stubPlugins
}

func (c *countingClient) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	c.p.mu.Lock()
	c.p.staged = append(c.p.staged, req.GetVolumeId())
	c.p.mu.Unlock()
	n := c.p.cur.Add(1)
	defer c.p.cur.Add(-1)
	for m := c.p.max.Load(); n > m && !c.p.max.CompareAndSwap(m, n); m = c.p.max.Load() {
	}
	return c.Client.NodeStageVolume(ctx, req)
}

func dialFake(t *testing.T, cfg fakeplugin.Config) (*fakeplugin.Plugin, *stubPlugins) {
	t.Helper()
	p, endpoint := fakeplugin.Start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := csi.Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return p, &stubPlugins{client: c}
}

func stageStep(dir, vol string) Step {
	return Step{Method: NodeStage, Plugin: "p", Volume: vol, Alloc: "a", Usage: "u", ExternalID: vol,
		Capability: fsCap(csi.AccessModeSingleNodeWriter), StagingPath: StagingPath(dir, "p", vol, "u")}
}

func TestRunner_Run_Classifies(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true, StrictVolumes: true})
	r := NewRunner(plugins, RunnerConfig{})
	ctx := context.Background()
	dir := t.TempDir()

	// Unpublish of a volume the plugin does not know: NotFound is success.
	res := r.Run(ctx, Step{Method: NodeUnpublish, Plugin: "p", ExternalID: "gone", TargetPath: dir + "/t"})
	if !res.OK() || csi.Code(res.Err) != codes.NotFound {
		t.Errorf("unpublish of an unknown volume: %+v, want success with NotFound kept", res)
	}
	// The same code on a publish-type call is final.
	res = r.Run(ctx, stageStep(dir, "gone"))
	if res.Outcome != csi.Final {
		t.Errorf("stage of an unknown volume: %+v, want final", res)
	}
	plugin.AddVolume(fakeplugin.Volume{ID: "v1"})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	if res = r.Run(ctx, stageStep(dir, "v1")); res.Outcome != csi.Uncertain {
		t.Errorf("unavailable stage: %+v, want uncertain", res)
	}
	if res = r.Run(ctx, stageStep(dir, "v1")); !res.OK() {
		t.Errorf("stage: %+v", res)
	}
	plugins.down.Store(true)
	res = r.Run(ctx, stageStep(dir, "v1"))
	if !res.Unavailable || res.Outcome != csi.Retry || !errors.Is(res.Err, ErrPluginUnavailable) {
		t.Errorf("stage with no client: %+v, want unavailable, retry", res)
	}
}

func TestRunner_Run_BoundsInFlightPerPlugin(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 30 * time.Millisecond})
	r := NewRunner(plugins, RunnerConfig{MaxInFlightPerPlugin: 2})
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res := r.Run(context.Background(), stageStep(dir, string(rune('a'+i)))); !res.OK() {
				t.Errorf("stage: %s", res.Err)
			}
		}()
	}
	wg.Wait()
	if m := plugins.max.Load(); m != 2 {
		t.Errorf("%d stage calls in flight at once, want exactly the bound 2", m)
	}
}

func TestRunner_Pause_WaitsForHealth(t *testing.T) {
	_, plugins := dialFake(t, fakeplugin.Config{})
	r := NewRunner(plugins, RunnerConfig{})
	plugins.down.Store(true)
	done := make(chan error, 1)
	go func() { done <- r.Pause(context.Background(), "p", NodePlugin, time.Millisecond) }()
	select {
	case err := <-done:
		t.Fatalf("Pause returned %v while the plugin was down", err)
	case <-time.After(20 * time.Millisecond):
	}
	plugins.down.Store(false)
	if err := <-done; err != nil {
		t.Errorf("Pause: %s", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Pause(ctx, "p", NodePlugin, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Pause with a cancelled context: %v", err)
	}
}

// parent is a stand-in volume actor: it spawns one claim actor, answers its
// TurnRequests with the steps in order, and records the StepDones.
type parent struct {
	steps []Step
	cfg   Config
	done  chan *StepDone
	turns atomic.Int32
}

func (p *parent) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		ctx.Spawn(NewProps(p.cfg))
	case *TurnRequest:
		p.turns.Add(1)
		if len(p.steps) == 0 {
			ctx.Send(ctx.Sender(), &Freed{})
			for _, c := range ctx.Children() {
				ctx.Send(c, &Freed{})
			}
			return
		}
		for _, c := range ctx.Children() {
			ctx.Send(c, &Turn{Step: p.steps[0]})
		}
	case *StepDone:
		p.done <- msg
		if msg.Result.OK() {
			p.steps = p.steps[1:]
			if len(p.steps) == 0 {
				for _, c := range ctx.Children() {
					ctx.Send(c, &Freed{})
				}
				return
			}
			for _, c := range ctx.Children() {
				ctx.Send(c, &Turn{Step: p.steps[0]})
			}
		}
	}
}

func TestActor_RetriesUntilSuccessThenStops(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Internal, Times: 2})
	log := logrus.New()
	log.Out = discard{}
	system := actorkit.NewSystem(logrus.NewEntry(log))
	defer system.Shutdown()
	dir := t.TempDir()
	p := &parent{
		steps: []Step{
			{Method: NodeUnpublish, Plugin: "p", Volume: "v", Alloc: "a", ExternalID: "v", TargetPath: dir + "/t"},
			{Method: NodeUnstage, Plugin: "p", Volume: "v", Alloc: "a", ExternalID: "v", StagingPath: dir + "/s"},
		},
		cfg: Config{Volume: "v", Alloc: "a", Plugin: "p", Runner: NewRunner(plugins, RunnerConfig{}),
			Backoff: csi.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}, Logger: logrus.NewEntry(log)},
		done: make(chan *StepDone, 16),
	}
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }))
	var got []string
	for len(got) < 4 {
		select {
		case d := <-p.done:
			got = append(got, d.Step.Method.String()+":"+d.Result.Outcome.String())
		case <-time.After(10 * time.Second):
			t.Fatalf("claim actor stalled after %v", got)
		}
	}
	want := []string{"NodeUnpublishVolume:final", "NodeUnpublishVolume:final", "NodeUnpublishVolume:success", "NodeUnstageVolume:success"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("steps reported %v, want %v", got, want)
		}
	}
	// After Freed the claim actor stops: the parent then stops cleanly.
	if err := system.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if n := plugin.Calls("NodeUnpublishVolume"); n != 3 {
		t.Errorf("NodeUnpublishVolume called %d times, want 3", n)
	}
}

// stepPlugins is a Plugins that records the step each Client call's
// context carries.
type stepPlugins struct {
	stubPlugins
	mu   sync.Mutex
	seen []Step // guarded by mu
}

func (p *stepPlugins) Client(ctx context.Context, plugin string, typ PluginType) (csi.Client, Facts, error) {
	if s, ok := StepFrom(ctx); ok {
		p.mu.Lock()
		p.seen = append(p.seen, s)
		p.mu.Unlock()
	}
	return p.stubPlugins.Client(ctx, plugin, typ)
}

func TestRunner_Run_ClientSeesStep(t *testing.T) {
	_, stub := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugins := &stepPlugins{stubPlugins: stubPlugins{client: stub.client}}
	r := NewRunner(plugins, RunnerConfig{})
	dir := t.TempDir()
	want := stageStep(dir, "v1")
	if res := r.Run(context.Background(), want); !res.OK() {
		t.Fatalf("stage: %+v", res)
	}
	// A call through Do carries no step.
	r.Do(context.Background(), "p", NodePlugin, csi.PublishKind, func(context.Context, csi.Client) error { return nil })
	plugins.mu.Lock()
	defer plugins.mu.Unlock()
	if len(plugins.seen) != 1 || plugins.seen[0].Method != NodeStage || plugins.seen[0].Volume != "v1" {
		t.Fatalf("steps seen by Client = %v, want the one NodeStageVolume of v1", plugins.seen)
	}
}
