package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// The secret values and mount flags the day-2 tests use: none of them may
// show in a log line, an event, an error or any output.
var dayOpsSecrets = []string{"s3cr3t-old-value", "s3cr3t-new-value", "mountpass-77"}

// realAgent is a started runtime served on a real unix socket, with a
// fake plugin (controller publish, stage, create) attached as the
// monolith allocation fake-1, and the log of everything.
type realAgent struct {
	t      *testing.T
	rt     *runtime.Runtime
	plugin *fakeplugin.Plugin
	env    map[string]string
	log    *syncBuffer
	addr   string
}

func startRealAgent(t *testing.T) *realAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "csiactor-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	a := &realAgent{t: t, log: &syncBuffer{}}
	l := logrus.New()
	l.SetOutput(a.log)
	l.SetLevel(logrus.DebugLevel)
	backoff := runtime.BackoffConfig{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, Multiplier: 2}
	rt, err := runtime.New(runtime.Config{
		DataDir: dir,
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond,
			RPCTimeout: 10 * time.Second, KillTimeout: 2 * time.Second, RestartBackoff: backoff,
		},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
		// The fake plugin mounts nothing.
		Host: runtime.HostConfig{SkipMountCheck: true},
	}, runtime.Options{Log: logrus.NewEntry(l)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	a.rt = rt
	a.addr = apitest.Serve(t, rt, api.Options{Log: logrus.NewEntry(l)})
	a.env = map[string]string{cli.AddressEnv: a.addr}
	a.plugin = a.attach("fake-1")
	return a
}

// attach serves a new fake plugin and registers it as monolith allocation
// id of plugin "fake", waiting until it is healthy.
func (a *realAgent) attach(id string) *fakeplugin.Plugin {
	a.t.Helper()
	p, endpoint := fakeplugin.Start(a.t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true})
	ctx := context.Background()
	if _, err := a.rt.RegisterAllocation(ctx, id, runtime.AllocationSpec{
		Plugin: "fake", Type: runtime.TypeMonolith, Socket: strings.TrimPrefix(endpoint, "unix://"),
	}); err != nil {
		a.t.Fatal(err)
	}
	if err := a.rt.WaitHealthy(ctx, "fake", runtime.TypeMonolith); err != nil {
		a.t.Fatal(err)
	}
	waitFor(a.t, "allocation "+id+" healthy", func() bool {
		as, err := a.rt.Allocations(ctx)
		if err != nil {
			return false
		}
		for _, al := range as {
			if al.ID == id {
				return al.Healthy
			}
		}
		return false
	})
	return p
}

func (a *realAgent) run(args ...string) result {
	a.t.Helper()
	return runCLI(a.t, a.env, args...)
}

func (a *realAgent) volume(id string) runtime.Volume {
	a.t.Helper()
	v, err := a.rt.Volume(context.Background(), id)
	if err != nil {
		a.t.Fatal(err)
	}
	return v
}

// events returns the agent's events of type typ.
func (a *realAgent) events(typ string) []runtime.Event {
	a.t.Helper()
	return eventsOf(a.t, a.rt, typ)
}

// noSecrets fails if a secret value or mount flag is in the agent's log,
// its events or out.
func (a *realAgent) noSecrets(out ...string) {
	a.t.Helper()
	evs := a.run("events", "-json")
	all := a.log.String() + evs.stdout + evs.stderr + strings.Join(out, "\n")
	for _, s := range dayOpsSecrets {
		if strings.Contains(all, s) {
			a.t.Errorf("%q shows in the log, the events or the output", s)
		}
	}
}

// registerArgs are the flags of volume register/update for volume id of
// the fake plugin with the given secret and mount flag.
func registerArgs(cmd, id, externalID, secret, flag string, extra ...string) []string {
	args := []string{"volume", cmd, "-plugin", "fake", "-external-id", externalID,
		"-capability", "single-node-writer", "-fs-type", "ext4", "-mount-flag", flag,
		"-parameter", "tier=fast", "-secret", "token=" + secret}
	return append(append(args, extra...), id)
}

func (a *realAgent) claim(vol, alloc string, extra ...string) result {
	a.t.Helper()
	args := append([]string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer"}, extra...)
	return a.run(append(args, vol)...)
}

// waitPastClaim waits until vol's past claim of alloc shows a last error:
// its teardown is failing and being retried.
func (a *realAgent) waitStuck(vol, alloc string) {
	a.t.Helper()
	waitFor(a.t, "past claim of "+alloc+" failing", func() bool {
		for _, c := range a.volume(vol).PastClaims {
			if c.Alloc == alloc && c.LastError != "" {
				return true
			}
		}
		return false
	})
}

// refuseTeardown makes the fake plugin refuse every teardown RPC, with a
// final error that the agent retries forever.
func refuseTeardown(p *fakeplugin.Plugin) {
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"} {
		p.SetFault(m, fakeplugin.Fault{Code: codes.Internal, Message: "backend storage is gone"})
	}
}

func TestVolumeUpdate_RealAgent(t *testing.T) {
	a := startRealAgent(t)
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).
		want(t, 0, "Registered volume vol1 (plugin fake, external ID ext-1)\n")
	a.claim("vol1", "web1").want(t, 0, "")
	a.run(registerArgs("update", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "Volume vol1 is unchanged\n")

	// Secrets change while the volume is claimed; the next RPCs use them.
	a.run(registerArgs("update", "vol1", "ext-1", "s3cr3t-new-value", "pass=mountpass-77")...).
		want(t, 0, "Updated volume vol1: secrets changed\n")
	// The same definition again is idempotent: no second event.
	a.run(registerArgs("update", "vol1", "ext-1", "s3cr3t-new-value", "pass=mountpass-77")...).want(t, 0, "Volume vol1 is unchanged\n")
	evs := a.events(runtime.EventVolumeUpdated)
	if len(evs) != 1 || evs[0].Message != "volume updated: secrets changed" || evs[0].Volume != "vol1" {
		t.Errorf("volume-updated events %+v, want one naming secrets", evs)
	}

	// The refusals, each naming what is wrong, changing nothing.
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"mount flag while claimed", registerArgs("update", "vol1", "ext-1", "s3cr3t-new-value", "pass=other"), 1,
			`csiactor: volume "vol1" is claimed by alloc "web1": mount_options cannot change while it has claims (only secrets can); release them first`},
		{"context while claimed", registerArgs("update", "vol1", "ext-1", "s3cr3t-new-value", "pass=mountpass-77", "-context", "share=s1"), 1,
			`volume "vol1" is claimed by alloc "web1": context cannot change while it has claims`},
		{"external ID", registerArgs("update", "vol1", "ext-2", "s3cr3t-new-value", "pass=mountpass-77"), 1,
			`external_id: volume "vol1" is registered with external_id "ext-1"; the external ID of a volume cannot change`},
		{"unknown volume", registerArgs("update", "nope", "ext-9", "s3cr3t-new-value", "pass=mountpass-77"), 1,
			"volume nope is not registered; register it with 'csiactor volume register'"},
		{"no external ID", []string{"volume", "update", "-plugin", "fake", "-capability", "single-node-writer", "vol1"}, 2,
			"-external-id is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := a.run(tc.args...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
			a.noSecrets(r.stdout, r.stderr)
		})
	}
	// A plugin change, through the API (the CLI's -plugin is the same
	// flag): 400 naming the field.
	spec := runtime.VolumeSpec{Plugin: "other", ExternalID: "ext-1",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}
	body, _ := spec.RequestJSON()
	code, msg := apiCall(t, a.addr, http.MethodPut, "/v1/volumes/vol1", string(body))
	if code != http.StatusBadRequest || !strings.Contains(msg, `plugin: volume \"vol1\" is registered with plugin \"fake\"`) {
		t.Errorf("PUT with another plugin = %d %s, want 400 naming plugin", code, msg)
	}
	if n := len(a.events(runtime.EventVolumeUpdated)); n != 1 {
		t.Errorf("%d volume-updated events after the refusals, want 1", n)
	}

	// The release's ControllerUnpublishVolume carries the new secret.
	a.run("volume", "release", "-alloc", "web1", "vol1").want(t, 0, "")
	waitFor(t, "web1's claim freed", func() bool { return len(a.volume("vol1").PastClaims) == 0 })
	req, _ := a.plugin.LastRequest("ControllerUnpublishVolume").(*csipb.ControllerUnpublishVolumeRequest)
	if req.GetSecrets()["token"] != "s3cr3t-new-value" {
		t.Errorf("ControllerUnpublishVolume secrets after the update: token=%q, want the new value", req.GetSecrets()["token"])
	}

	// Without claims, the mount options, parameters and context change;
	// the next claim publishes with them.
	a.run(registerArgs("update", "vol1", "ext-1", "s3cr3t-new-value", "pass=mountpass-99", "-context", "share=s1")...).
		want(t, 0, "Updated volume vol1: mount_options, context changed\n")
	evs = a.events(runtime.EventVolumeUpdated)
	if last := evs[len(evs)-1]; last.Message != "volume updated: mount_options, context changed" {
		t.Errorf("last volume-updated event %q", last.Message)
	}
	a.claim("vol1", "web2").want(t, 0, "")
	pub, _ := a.plugin.LastRequest("NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if got := pub.GetVolumeCapability().GetMount().GetMountFlags(); len(got) != 1 || got[0] != "pass=mountpass-99" || pub.GetVolumeContext()["share"] != "s1" {
		t.Errorf("NodePublishVolume after the update: flags %d, context %v", len(got), pub.GetVolumeContext())
	}
	st := a.run("volume", "status", "vol1")
	st.contains(t, "stdout", "Context        share=s1", "1 mount flag (not shown)")
	dayOpsSecrets = append(dayOpsSecrets, "mountpass-99")
	a.noSecrets(st.stdout, a.run("volume", "status", "-json", "vol1").stdout)
}

func unixDial(path string) func(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", path) }
}

// apiCall sends one request to the agent at addr and returns the status
// and the body.
func apiCall(t *testing.T, addr, method, path, body string) (int, string) {
	t.Helper()
	sock := strings.TrimPrefix(addr, "unix://")
	hc := &http.Client{Transport: &http.Transport{DialContext: unixDial(sock)}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://csiactor"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestVolumeReleaseForce_RealAgent(t *testing.T) {
	a := startRealAgent(t)
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	target := a.claim("vol1", "web1")
	target.want(t, 0, "")

	refuseTeardown(a.plugin)
	a.run("volume", "release", "-alloc", "web1", "vol1").want(t, 0, "Released the claim of web1 on vol1 (state taken)\n")
	a.waitStuck("vol1", "web1")
	// Stuck: the next claim is refused.
	a.claim("vol1", "web2").contains(t, "stderr", `access mode single-node-writer allows one claim and alloc "web1" holds it`)

	before := map[string]int{}
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"} {
		before[m] = a.plugin.Calls(m)
	}
	r := a.run("volume", "release", "-force", "-alloc", "web1", "vol1")
	r.want(t, 0, "")
	r.contains(t, "stdout", "Forced the release of the claim of web1 on vol1: it is forgotten\nMay be left (clean up by hand):\n",
		"  target mount "+strings.TrimSpace(target.stdout)+" (NodeUnpublishVolume: ",
		"  staging ", "(NodeUnstageVolume: ",
		"  controller attachment to node ", "(ControllerUnpublishVolume: ", "backend storage is gone")
	for m, n := range before {
		if got := a.plugin.Calls(m); got < n+1 {
			t.Errorf("%s called %d times by the forced release, want at least once", m, got-n)
		}
	}
	v := a.volume("vol1")
	if len(v.Claims)+len(v.PastClaims) != 0 {
		t.Fatalf("volume after the forced release: %+v", v)
	}
	evs := a.events(runtime.EventClaimForceReleased)
	if len(evs) != 1 || evs[0].Alloc != "web1" || !strings.Contains(evs[0].Message, "may be left: target mount ") ||
		!strings.Contains(evs[0].Message, "staging ") || !strings.Contains(evs[0].Message, "controller attachment to node ") {
		t.Errorf("claim-force-released events %+v", evs)
	}
	for _, ev := range a.events(runtime.EventClaimFreed) {
		if ev.Alloc == "web1" {
			t.Errorf("a forced release says the claim was freed: %+v", ev)
		}
	}
	if !strings.Contains(a.log.String(), "level=warning") || !strings.Contains(a.log.String(), "forced release") {
		t.Errorf("no warning about the forced release in the log")
	}
	// The claim actor stopped retrying: no teardown RPC after the force.
	counts := fmt.Sprint(a.plugin.Calls("NodeUnpublishVolume"), a.plugin.Calls("ControllerUnpublishVolume"))

	// The volume can be claimed again at once (the plugin still refuses
	// every teardown), and is staged again rather than trusted.
	a.claim("vol1", "web2").want(t, 0, "")
	if again := fmt.Sprint(a.plugin.Calls("NodeUnpublishVolume"), a.plugin.Calls("ControllerUnpublishVolume")); again != counts {
		t.Errorf("teardown RPCs after the forced release: %s, then %s", counts, again)
	}

	// What was left is left: web1's target is still published on the
	// plugin, so web2's teardown cannot unstage, and says so.
	a.plugin.ClearFaults()
	r = a.run("volume", "release", "-force", "-alloc", "web2", "vol1")
	r.want(t, 0, "")
	r.contains(t, "stdout", "  staging ", "is still published at 1 target path(s)")

	// Forcing a live claim releases it, then forces it: here the plugin
	// answers, so nothing is left.
	a.run(registerArgs("register", "vol2", "ext-2", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	a.claim("vol2", "web3").want(t, 0, "")
	r = a.run("volume", "release", "-force", "-json", "-alloc", "web3", "vol2")
	r.want(t, 0, "")
	var fr runtime.ForcedRelease
	if err := json.Unmarshal([]byte(r.stdout), &fr); err != nil || fr.State != runtime.ClaimFreed || fr.Alloc != "web3" || len(fr.Left) != 0 {
		t.Errorf("release -force -json = %+v, %v", fr, err)
	}
	if v := a.volume("vol2"); len(v.Claims)+len(v.PastClaims) != 0 {
		t.Errorf("after forcing a live claim: volume %+v", v)
	}
	if _, ok := a.plugin.Staged()["ext-2"]; ok || len(a.plugin.Published()["ext-2"]) != 0 {
		t.Errorf("after forcing a live claim the plugin has ext-2: staged %v published %v", a.plugin.Staged(), a.plugin.Published())
	}
	if _, ok := a.plugin.ControllerPublished()["ext-2"]; ok {
		t.Errorf("after forcing a live claim ext-2 is attached: %v", a.plugin.ControllerPublished())
	}
	r = a.run("volume", "release", "-alloc", "web3", "vol2")
	r.want(t, 1, "")
	r.contains(t, "stderr", `alloc "web3" holds no claim on volume "vol2"`)
	r = a.run("volume", "release", "-force", "-alloc", "web9", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `alloc "web9" holds no claim on volume "vol1"`)
	code, msg := apiCall(t, a.addr, http.MethodDelete, "/v1/volumes/vol1/claims/web9?force=maybe", "")
	if code != http.StatusBadRequest || !strings.Contains(msg, `force: \"maybe\": want true or false`) {
		t.Errorf("force=maybe = %d %s", code, msg)
	}
	a.noSecrets()
}

func TestVolumeDeregisterForce_RealAgent(t *testing.T) {
	a := startRealAgent(t)
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	a.claim("vol1", "web1").want(t, 0, "")
	r := a.run("volume", "deregister", "-force", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "vol1" is in use: it has 1 claim; force forgets past claims only: release the claims first`)

	refuseTeardown(a.plugin)
	a.run("volume", "release", "-alloc", "web1", "vol1").want(t, 0, "")
	a.waitStuck("vol1", "web1")
	r = a.run("volume", "deregister", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "vol1" is in use: it has 1 past claim not yet freed; wait for them to be freed, or deregister with force`)
	code, msg := apiCall(t, a.addr, http.MethodDelete, "/v1/volumes/vol1?force=true&delete=true", "")
	if code != http.StatusBadRequest || !strings.Contains(msg, "force and delete cannot be combined") {
		t.Errorf("force with delete = %d %s", code, msg)
	}

	a.run("volume", "deregister", "-force", "vol1").want(t, 0, "Deregistered volume vol1\n")
	a.run("volume", "status", "vol1").contains(t, "stderr", `volume "vol1" not found`)
	evs := a.events(runtime.EventVolumeForceDeregistered)
	if len(evs) != 1 || !strings.Contains(evs[0].Message, `volume deregistered by force with 1 past claim not yet freed: alloc "web1" (taken; may be left: target mount `) ||
		!strings.Contains(evs[0].Message, "controller attachment to node ") {
		t.Errorf("volume-force-deregistered events %+v", evs)
	}
	if !strings.Contains(a.log.String(), "level=warning msg=\"volume deregistered by force") {
		t.Errorf("no warning about the forced deregistration in the log")
	}
	// The teardown stopped with the volume, and the ID is free again.
	calls := a.plugin.Calls("NodeUnpublishVolume")
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	if v := a.volume("vol1"); len(v.PastClaims) != 0 {
		t.Errorf("registered again: %+v", v)
	}
	if got := a.plugin.Calls("NodeUnpublishVolume"); got > calls+1 {
		t.Errorf("NodeUnpublishVolume went on after the forced deregistration: %d calls, then %d", calls, got)
	}
	a.noSecrets()
}

func TestAllocDeregister_LastHealthy_RealAgent(t *testing.T) {
	a := startRealAgent(t)
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	a.claim("vol1", "web1").want(t, 0, "")

	r := a.run("alloc", "deregister", "fake-1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `allocation "fake-1" is the last healthy controller and node allocation of plugin "fake", and 1 claim depends on it: volume "vol1": alloc "web1" (published); release them first, or deregister the allocation with force`)
	if _, err := a.rt.Plugin(context.Background(), "fake"); err != nil {
		t.Fatalf("refused deregistration changed something: %v", err)
	}

	// With another healthy allocation of the plugin, nothing depends on
	// this one alone.
	p2 := a.attach("fake-2")
	a.run("alloc", "deregister", "fake-1").want(t, 0, "Deregistered allocation fake-1\n")

	// A past claim being released depends on the last one too.
	refuseTeardown(p2)
	a.run("volume", "release", "-alloc", "web1", "vol1").want(t, 0, "")
	a.waitStuck("vol1", "web1")
	r = a.run("alloc", "deregister", "fake-2")
	r.want(t, 1, "")
	r.contains(t, "stderr", `allocation "fake-2" is the last healthy controller and node allocation of plugin "fake", and 1 claim depends on it: volume "vol1": alloc "web1" (past claim, taken)`)

	a.run("alloc", "deregister", "-force", "fake-2").want(t, 0, "Deregistered allocation fake-2\n")
	evs := a.events(runtime.EventAllocationForceDeregistered)
	if len(evs) != 1 || evs[0].Alloc != "fake-2" || evs[0].Plugin != "fake" || !strings.Contains(evs[0].Message, `allocation deregistered by force; allocation "fake-2" is the last healthy controller and node allocation of plugin "fake", and 1 claim depends on it: volume "vol1": alloc "web1" (past claim, taken)`) {
		t.Errorf("allocation-force-deregistered events %+v", evs)
	}
	if !strings.Contains(a.log.String(), "level=warning msg=\"allocation deregistered by force") {
		t.Errorf("no warning about the forced deregistration in the log")
	}
	// The past claim stays, waiting for the plugin to come back.
	if v := a.volume("vol1"); len(v.PastClaims) != 1 || v.PastClaims[0].Alloc != "web1" {
		t.Errorf("volume after the forced deregistration: %+v", v)
	}
	a.noSecrets()
}

func TestVolumeClaimWait_RealAgent(t *testing.T) {
	a := startRealAgent(t)
	a.run(registerArgs("register", "vol1", "ext-1", "s3cr3t-old-value", "pass=mountpass-77")...).want(t, 0, "")
	a.claim("vol1", "web1").want(t, 0, "")

	// A waiting claim gets the volume once web1's claim is released and
	// freed.
	ctx := context.Background()
	stdout, stderr, done := startCLI(ctx, t, a.env, nil, "volume", "claim", "-wait", "30s", "-alloc", "web2", "-mode", "write", "-access-mode", "single-node-writer", "vol1")
	// It is waiting (its first attempt was refused) before web1 goes:
	// nothing else makes the manager try a claim of web2.
	waiting := func(n int) func() bool {
		return func() bool { return strings.Count(a.log.String(), "waiting for them to go") >= n }
	}
	waitFor(t, "web2's claim to wait", waiting(1))
	a.run("volume", "release", "-alloc", "web1", "vol1").want(t, 0, "")
	if code := exitCode(t, done); code != 0 {
		t.Fatalf("claim -wait exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "/per-alloc/web2/vol1/") {
		t.Errorf("claim -wait printed %q, want web2's target path", stdout.String())
	}

	// Nothing frees the place within the wait: the 409 as without it.
	r := a.claim("vol1", "web3", "-wait", "300ms")
	r.want(t, 1, "")
	r.contains(t, "stderr", `access mode single-node-writer allows one claim and alloc "web2" holds it (waited 300ms for it to be freed)`)

	// A client that goes away ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	_, _, done = startCLI(cctx, t, a.env, nil, "volume", "claim", "-wait", "5m", "-alloc", "web4", "-mode", "write", "-access-mode", "single-node-writer", "vol1")
	waitFor(t, "web4's claim to wait", waiting(3)) // web3's, then web4's
	cancel()
	if code := exitCode(t, done); code != 1 {
		t.Errorf("canceled claim -wait exit %d, want 1", code)
	}
	// The agent's handler stopped waiting: it answered, and logged it.
	waitFor(t, "the canceled wait to end in the agent", func() bool { return strings.Contains(a.log.String(), `msg="request canceled"`) })

	for _, tc := range []struct{ wait, want string }{
		{"0s", `-wait: "0s": want a duration like 30s, more than 0 and at most 10m0s`},
		{"11m", `-wait: "11m": want a duration like 30s`},
		{"soon", `-wait: "soon": want a duration like 30s`},
	} {
		r := a.claim("vol1", "web5", "-wait", tc.wait)
		r.want(t, 2, "")
		r.contains(t, "stderr", tc.want)
	}
	code, msg := apiCall(t, a.addr, http.MethodPost, "/v1/volumes/vol1/claims?wait=-1s",
		`{"alloc":"web5","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system"}`)
	if code != http.StatusBadRequest || !strings.Contains(msg, `wait: \"-1s\": want a duration`) {
		t.Errorf("wait=-1s = %d %s", code, msg)
	}
	if v := a.volume("vol1"); len(v.Claims) != 1 || v.Claims[0].Alloc != "web2" {
		t.Errorf("claims after the refusals: %+v", v.Claims)
	}
	w := a.events(runtime.EventClaimWaiting)
	if len(w) != 3 || w[0].Alloc != "web2" || w[0].Plugin != "fake" ||
		w[0].Message != `claim waits up to 30s for other claims to go: access mode single-node-writer allows one claim and alloc "web1" holds it` {
		t.Errorf("claim-waiting events %+v", w)
	}
	a.noSecrets()
}
