package claim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// TestRunner_Run_CountsFailures: every failed step is counted by plugin,
// CSI method and code; successes (NotFound on an unpublish too) and a step
// stopped by its caller are not.
func TestRunner_Run_CountsFailures(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true, StrictVolumes: true})
	failures := NewStepFailures()
	r := NewRunner(plugins, RunnerConfig{StepFailures: failures})
	ctx := context.Background()
	dir := t.TempDir()

	r.Run(ctx, Step{Method: NodeUnpublish, Plugin: "p", ExternalID: "gone", TargetPath: dir + "/t"}) // NotFound: success
	r.Run(ctx, stageStep(dir, "gone"))                                                               // NotFound: final
	plugin.AddVolume(fakeplugin.Volume{ID: "v1"})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.FailedPrecondition, Times: 2})
	r.Run(ctx, stageStep(dir, "v1"))
	r.Run(ctx, stageStep(dir, "v1"))
	if res := r.Run(ctx, stageStep(dir, "v1")); !res.OK() {
		t.Fatalf("stage: %+v", res)
	}
	plugin.SetFault("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Internal, Times: 1})
	r.Run(ctx, Step{Method: NodeUnstage, Plugin: "p", ExternalID: "v1", StagingPath: StagingPath(dir, "p", "v1", "u")})

	// Stopped by its caller while the plugin hangs: not a failure.
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Hang: true, Times: 1})
	calls := plugin.Calls("NodeStageVolume")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan Result, 1)
	go func() { done <- r.Run(sctx, stageStep(dir, "v1")) }()
	for deadline := time.Now().Add(20 * time.Second); plugin.Calls("NodeStageVolume") == calls; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the hanging NodeStageVolume never reached the plugin")
		}
	}
	cancel()
	if res := <-done; res.OK() {
		t.Fatalf("stopped stage: %+v, want a failure", res)
	}

	plugins.down.Store(true)
	r.Run(ctx, stageStep(dir, "v1"))

	want := `# HELP csiactor_claim_step_failures_total Failed claim and release steps, by plugin, step (the CSI method) and code (the gRPC status code; Unavailable when no plugin could be asked).
# TYPE csiactor_claim_step_failures_total counter
csiactor_claim_step_failures_total{code="FailedPrecondition",plugin="p",step="NodeStageVolume"} 2
csiactor_claim_step_failures_total{code="Internal",plugin="p",step="NodeUnstageVolume"} 1
csiactor_claim_step_failures_total{code="NotFound",plugin="p",step="NodeStageVolume"} 1
csiactor_claim_step_failures_total{code="Unavailable",plugin="p",step="NodeStageVolume"} 1
`
	if err := testutil.CollectAndCompare(failures, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
