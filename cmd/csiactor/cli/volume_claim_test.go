package cli_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// openPTY opens a pseudo-terminal and returns its controlling side (to
// read what is written) and its terminal side (to hand the CLI as stdout).
func openPTY(t *testing.T) (ctrl, term *os.File) {
	t.Helper()
	ctrl, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	fd := int(ctrl.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open pts %d: %v", n, err)
	}
	// Raw output: no "\n" to "\r\n" translation.
	tio, err := unix.IoctlGetTermios(int(term.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(term.Fd()), unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close(); ctrl.Close() })
	return ctrl, term
}

// claimAgent serves a started runtime, with a fake plugin attached as a
// monolith, on a unix socket, and returns the plugin and the CLI's
// environment.
func claimAgent(t *testing.T) (*runtime.Runtime, *fakeplugin.Plugin, map[string]string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "csiactor-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	backoff := runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	rt, err := runtime.New(runtime.Config{
		DataDir: dir,
		Plugins: runtime.PluginsConfig{HeartbeatInterval: 500 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
		Host:    runtime.HostConfig{SkipMountCheck: true}, // the fake plugin mounts nothing
	}, runtime.Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
	p, endpoint := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true})
	if _, err := rt.RegisterAllocation(ctx, "fake-1", runtime.AllocationSpec{
		Plugin: "fake", Type: runtime.TypeMonolith, Socket: strings.TrimPrefix(endpoint, "unix://"),
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fake plugin healthy", func() bool {
		pl, err := rt.Plugin(ctx, "fake")
		return err == nil && pl.ControllersHealthy == 1 && pl.NodesHealthy == 1
	})
	if _, err := rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "data1", VolumeSpec: runtime.VolumeSpec{
		Plugin: "fake", Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
	}}); err != nil {
		t.Fatal(err)
	}
	addr := apitest.Serve(t, rt, api.Options{})
	return rt, p, map[string]string{cli.AddressEnv: addr}
}

// On a terminal, volume claim prints each step as the agent's events
// report it, a retried step with its error, and then the target path.
func TestVolumeClaim_Terminal_ShowsSteps(t *testing.T) {
	_, p, env := claimAgent(t)
	p.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "storage busy", Times: 1})
	ctrl, term := openPTY(t)
	var stderr syncBuffer
	code := cli.Run(context.Background(), []string{"volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1"},
		term, &stderr, cli.WithGetenv(func(k string) string { return env[k] }))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	term.Close()
	var lines []string
	sc := bufio.NewScanner(ctrl)
	for sc.Scan() { // ends with EIO once the terminal side is closed
		lines = append(lines, sc.Text())
	}
	out := strings.Join(lines, "\n")
	want := []string{
		"Claiming volume data1 for alloc web1 (write, single-node-writer/file-system)",
		"write claim reserved (single-node-writer/file-system)",
		"  controller-published",
		"attempt 1 failed, retrying: NodeStageVolume: ",
		"storage busy",
		"  staged",
		"write claim published at ",
	}
	at := 0
	for _, w := range want {
		i := strings.Index(out[at:], w)
		if i < 0 {
			t.Fatalf("terminal output lacks %q (in order):\n%s", w, out)
		}
		at += i + len(w)
	}
	last := lines[len(lines)-1]
	if !strings.HasSuffix(last, "/per-alloc/web1/data1/rw-file-system-single-node-writer") || strings.Contains(last, " ") {
		t.Errorf("last line %q is not the target path", last)
	}

	// Claiming again: published already, so no steps, only the path.
	ctrl2, term2 := openPTY(t)
	code = cli.Run(context.Background(), []string{"volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1"},
		term2, &stderr, cli.WithGetenv(func(k string) string { return env[k] }))
	if code != 0 {
		t.Fatalf("claim again: exit %d: %s", code, stderr.String())
	}
	term2.Close()
	sc = bufio.NewScanner(ctrl2)
	var again []string
	for sc.Scan() {
		again = append(again, sc.Text())
	}
	if len(again) != 2 || again[1] != last {
		t.Errorf("claim again printed %q, want the header and %q", again, last)
	}
}

// Not on a terminal (a pipe, a file), only the target path is printed.
func TestVolumeClaim_NotTerminal_PathOnly(t *testing.T) {
	_, _, env := claimAgent(t)
	r := runCLI(t, env, "volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1")
	r.want(t, 0, "")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 1 || !strings.HasSuffix(lines[0], "/rw-file-system-single-node-writer") {
		t.Errorf("stdout = %q, want the target path alone", r.stdout)
	}
}

// -timeout ends the wait with an error that says the agent goes on with
// the claim, and the agent does publish it.
func TestVolumeClaim_Timeout(t *testing.T) {
	rt, p, env := claimAgent(t)
	p.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "storage busy"})
	r := runCLI(t, env, "volume", "claim", "-timeout", "300ms", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1")
	r.want(t, 1, "")
	want := `csiactor: the claim of alloc "web1" on volume "data1" was not published within 300ms; the agent goes on with it: ` +
		`follow it with 'csiactor volume status data1', or give it up with 'csiactor volume release -alloc web1 data1'` + "\n"
	if r.stderr != want {
		t.Errorf("stderr = %q\nwant %q", r.stderr, want)
	}
	p.ClearFaults()
	waitFor(t, "the claim published after the CLI gave up", func() bool {
		v, err := rt.Volume(context.Background(), "data1")
		return err == nil && len(v.Claims) == 1 && v.Claims[0].State == runtime.ClaimPublished
	})
	r = runCLI(t, env, "volume", "claim", "-timeout", "0s", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-timeout must be positive")
}
