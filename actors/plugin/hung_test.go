package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

// publishHangs sends NodePublishVolume, which the plugin hangs, through
// the allocation's client: it ends in DeadlineExceeded (RPCTimeout).
func publishHangs(t *testing.T, c csi.Client) {
	t.Helper()
	err := c.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{
		VolumeId: "slow", TargetPath: "/unused/slow", VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}})
	if csi.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("hung NodePublishVolume = %v, want DeadlineExceeded", err)
	}
}

// unpublishAnswers sends NodeUnpublishVolume, which the plugin answers.
func unpublishAnswers(t *testing.T, c csi.Client) {
	t.Helper()
	err := c.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "other", TargetPath: "/unused/other"})
	if csi.Unanswered(err) {
		t.Fatalf("NodeUnpublishVolume = %v, want an answer", err)
	}
}

// status asks the actor for its status. The client's observer has sent
// every call's end before the call returned, so the answer reflects the
// calls made so far.
func (h *harness) status() Status {
	h.t.Helper()
	r, err := actorkit.Request(context.Background(), h.sys, h.child, &GetStatus{}, 30*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	return r.(Status)
}

func hungConfig(c *Config) {
	c.RPCTimeout = 100 * time.Millisecond
	c.HungRPCRestart = 3
	c.HeartbeatInterval = time.Hour // only the hung check fingerprints
}

// TestActor_Exec_HungNodeRPCs_Restarts: a plugin that answers Probe but
// hangs NodePublishVolume is restarted after three publishes in a row
// time out; a publish that times out now and then between answered node
// RPCs (one slow volume) restarts nothing.
func TestActor_Exec_HungNodeRPCs_Restarts(t *testing.T) {
	defer leakcheck.Check(t)()
	env := fakeEnv("hung")
	env["FAKE_HANG"] = "NodePublishVolume"
	spec, err := Spec{ID: "h1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: env}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, hungConfig)
	defer h.close()
	first := h.waitHealthy()
	c := first.Client

	// One slow volume: two timeouts, then an answer, three times over.
	for range 3 {
		publishHangs(t, c)
		publishHangs(t, c)
		unpublishAnswers(t, c)
	}
	if s := h.status(); !s.Healthy || s.PID != first.PID || s.Hung != 0 {
		t.Fatalf("after timeouts broken by answers: healthy %v PID %d (was %d) hung %d; want untouched", s.Healthy, s.PID, first.PID, s.Hung)
	}

	// Every node RPC hangs: the third in a row restarts the plugin.
	for range 3 {
		publishHangs(t, c)
	}
	s := h.waitUnhealthy("plugin process exited with signal: killed after node RPCs hang: 3 in a row ended in DeadlineExceeded while the plugin answers Probe; restarting in ")
	if s.Hung != 1 || s.Exits != 1 {
		t.Errorf("hung %d exits %d, want 1 and 1", s.Hung, s.Exits)
	}
	second := h.waitHealthy()
	if second.PID == first.PID || alive(first.PID) {
		t.Errorf("new PID %d, old %d alive %v", second.PID, first.PID, alive(first.PID))
	}
	h.shutdown(ReasonDeregistered)
}

// TestActor_HungCheck_FingerprintFailsFirst: the fingerprint that checks
// a plugin after its third node RPC in a row timed out fails (on a loaded
// machine it can time out); the plugin is unhealthy, and once a
// fingerprint answers again, with no node RPC answered meanwhile, it is
// found hung. The check used to end with the failed fingerprint, and the
// plugin was healthy again with its node RPCs hanging.
func TestActor_HungCheck_FingerprintFailsFirst(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{Name: "hung"})
	defer fake.Stop()
	fake.SetFault("NodePublishVolume", fakeplugin.Fault{Hang: true})
	h := newHarness(t, attached("ah1", Node, ep), StaleProcess{}, hungConfig)
	defer h.close()
	c := h.waitHealthy().Client
	publishHangs(t, c)
	publishHangs(t, c)
	fake.SetFault("Probe", fakeplugin.Fault{Code: codes.Internal, Message: "probe failed", Times: 1})
	publishHangs(t, c)
	h.waitUnhealthy("probe failed")
	s := h.waitUnhealthy("node RPCs hang: 3 in a row ended in DeadlineExceeded while the plugin answers Probe")
	if s.Hung != 1 || fake.Calls("Probe") < 2 {
		t.Errorf("hung %d after %d Probes; want 1, found by the fingerprint after the failed one", s.Hung, fake.Calls("Probe"))
	}
}

// TestActor_Attached_HungNodeRPCs_Reported: an attached plugin whose node
// RPCs hang is reported unhealthy (the agent does not run it), and is
// healthy again at its next fingerprint; with the count off, nothing
// happens.
func TestActor_Attached_HungNodeRPCs_Reported(t *testing.T) {
	for _, tt := range []struct {
		name  string
		limit int
	}{{"count on", 3}, {"count off", -1}} {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			fake, ep := startFake(t, fakeplugin.Config{Name: "hung"})
			defer fake.Stop()
			fake.SetFault("NodePublishVolume", fakeplugin.Fault{Hang: true})
			h := newHarness(t, attached("ah1", Node, ep), StaleProcess{}, func(c *Config) {
				hungConfig(c)
				c.HungRPCRestart = tt.limit
			})
			defer h.close()
			c := h.waitHealthy().Client
			for range 3 {
				publishHangs(t, c)
			}
			if tt.limit < 0 {
				if s := h.status(); !s.Healthy || s.Hung != 0 {
					t.Fatalf("with the count off: healthy %v hung %d %q", s.Healthy, s.Hung, s.Description)
				}
				return
			}
			s := h.waitUnhealthy("node RPCs hang: 3 in a row ended in DeadlineExceeded while the plugin answers Probe")
			if s.Hung != 1 || strings.Contains(s.Description, "restart") {
				t.Errorf("hung %d, description %q; want 1, and no restart of a plugin the agent does not run", s.Hung, s.Description)
			}
			h.sys.Root.Send(h.child, &Refingerprint{})
			h.waitHealthy()
		})
	}
}
