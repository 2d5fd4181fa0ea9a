package cli_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// syncBuffer is a bytes.Buffer safe for a writer and a reader in different
// goroutines (the agent writes while the test reads).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the command line in-process with an environment of env only.
func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	return runCLIContext(context.Background(), t, env, nil, args...)
}

func runCLIContext(ctx context.Context, t *testing.T, env map[string]string, opts []cli.Option, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	opts = append([]cli.Option{cli.WithGetenv(func(k string) string { return env[k] })}, opts...)
	code := cli.Run(ctx, args, &stdout, &stderr, opts...)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// fakeAgent serves the fake backend on a real unix socket and returns it
// with the environment that points the CLI at it.
func fakeAgent(t *testing.T) (*apitest.Backend, map[string]string) {
	t.Helper()
	b := apitest.NewBackend()
	b.SetClock(func() time.Time { return time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC) })
	addr := apitest.Serve(t, b, api.Options{})
	return b, map[string]string{cli.AddressEnv: addr}
}

// populated fills the fake with two plugins' allocations and two volumes,
// one claimed.
func populated(t *testing.T) (*apitest.Backend, map[string]string) {
	t.Helper()
	b, env := fakeAgent(t)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.RegisterAllocation(ctx, "hp1", runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/run/hp.sock"})
	must(err)
	_, err = b.RegisterAllocation(ctx, "nfs-node", runtime.AllocationSpec{Plugin: "nfs", Type: runtime.TypeNode, Command: []string{"/bin/nfs"}})
	must(err)
	b.SetHealth("nfs-node", false, "unhealthy: probe: connection refused")
	_, err = b.RegisterVolume(ctx, "vol1", runtime.VolumeSpec{
		Plugin: "hostpath", ExternalID: "ext-1",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		MountOptions: &runtime.MountOptions{FSType: "ext4", MountFlags: []string{"password=hunter2"}},
		Parameters:   map[string]string{"tier": "fast"},
		Secrets:      map[string]string{"apikey": "topsecret"},
	})
	must(err)
	_, err = b.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol2", CapacityBytes: 1 << 30, VolumeSpec: runtime.VolumeSpec{
		Plugin: "hostpath", Capabilities: []runtime.Capability{{AccessMode: "multi-node-multi-writer", AttachmentMode: "block-device"}},
	}})
	must(err)
	_, err = b.Claim(ctx, "vol1", runtime.ClaimRequest{Alloc: "web-1", Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system"})
	must(err)
	return b, env
}

// want checks a result's exit code and that stdout equals (when
// wantStdout is not empty) the expected text.
func (r result) want(t *testing.T, code int, wantStdout string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	if wantStdout != "" && r.stdout != wantStdout {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, wantStdout)
	}
}

func (r result) contains(t *testing.T, stream string, subs ...string) {
	t.Helper()
	out := r.stdout
	if stream == "stderr" {
		out = r.stderr
	}
	for _, s := range subs {
		if !strings.Contains(out, s) {
			t.Errorf("%s lacks %q:\n%s", stream, s, out)
		}
	}
}

func TestRun_Usage_ExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stream string
		want   []string
	}{
		{"no args", nil, 2, "stderr", []string{"csiactor: missing command", "Usage: csiactor <command>", "volume ", "agent "}},
		{"help", []string{"-h"}, 0, "stdout", []string{"Usage: csiactor <command>", "Commands:"}},
		{"help word", []string{"help"}, 0, "stdout", []string{"Commands:"}},
		{"unknown command", []string{"volumes"}, 2, "stderr", []string{"csiactor: unknown command \"volumes\"\nrun 'csiactor -h' for usage\n"}},
		{"unknown subcommand", []string{"volume", "attach"}, 2, "stderr", []string{"csiactor volume: unknown command \"attach\"\nrun 'csiactor volume -h' for usage\n"}},
		{"missing subcommand", []string{"plugin"}, 2, "stderr", []string{"csiactor plugin: missing command\nrun 'csiactor plugin -h' for usage\n"}},
		{"unknown flag", []string{"volume", "list", "-verbose"}, 2, "stderr", []string{"csiactor volume list: flag provided but not defined: -verbose\nrun 'csiactor volume list -h' for usage\n"}},
		{"bad flag value", []string{"alloc", "logs", "-tail", "x", "a1"}, 2, "stderr", []string{"csiactor alloc logs: invalid value \"x\" for flag -tail: want a whole number\nrun 'csiactor alloc logs -h' for usage\n"}},
		{"missing arg", []string{"volume", "status"}, 2, "stderr", []string{"csiactor volume status: missing ID\nrun 'csiactor volume status -h' for usage\n"}},
		{"extra arg", []string{"plugin", "list", "x"}, 2, "stderr", []string{"csiactor plugin list: unexpected argument \"x\"\nrun 'csiactor plugin list -h' for usage\n"}},
		{"leaf help", []string{"volume", "create", "-h"}, 0, "stdout", []string{"Usage: csiactor volume create [flags] ID", "-capacity size", "-secrets-file file", "1GiB, 500M, 4096"}},
		{"hidden command not listed", []string{"-h"}, 0, "stdout", []string{"version "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, nil, tc.args...)
			r.want(t, tc.code, "")
			r.contains(t, tc.stream, tc.want...)
			if tc.code == 2 && tc.args != nil {
				// A mistake gets the error and one hint line, never the help.
				if r.stderr != tc.want[0] || strings.Contains(r.stderr, "Usage:") {
					t.Errorf("stderr = %q, want exactly %q", r.stderr, tc.want[0])
				}
			}
			if tc.name == "hidden command not listed" && strings.Contains(r.stdout, "example-plugin") {
				t.Error("usage lists the hidden example-plugin command")
			}
		})
	}
}

func TestRun_Unreachable_Message(t *testing.T) {
	addr := "unix://" + t.TempDir() + "/api.sock"
	r := runCLI(t, map[string]string{cli.AddressEnv: addr}, "status")
	r.want(t, 1, "")
	want := "csiactor: cannot reach the agent at " + addr + ": connect: no such file or directory; is `csiactor agent` running? set -address or CSIACTOR_ADDR (address from $CSIACTOR_ADDR)\n"
	if r.stderr != want {
		t.Errorf("stderr = %q\nwant %q", r.stderr, want)
	}
}

// -address beats CSIACTOR_ADDR, which beats the default.
func TestRun_Address_Precedence(t *testing.T) {
	_, env := fakeAgent(t)
	bad := map[string]string{cli.AddressEnv: "unix://" + t.TempDir() + "/nothing.sock"}
	runCLI(t, bad, "plugin", "list", "-address", env[cli.AddressEnv]).want(t, 0, "")
	runCLI(t, env, "plugin", "list").want(t, 0, "")
	r := runCLI(t, nil, "plugin", "list")
	r.want(t, 1, "")
	r.contains(t, "stderr", "cannot reach the agent at "+cli.DefaultAddress, "(address from the default address)")
	r = runCLI(t, bad, "plugin", "list", "-address", "tcp://x")
	r.want(t, 1, "")
	r.contains(t, "stderr", `bad agent address: "tcp://x"`, "(from -address)")
	r = runCLI(t, map[string]string{cli.AddressEnv: "127.0.0.1:7460"}, "plugin", "list")
	r.want(t, 1, "")
	r.contains(t, "stderr", `bad agent address: "127.0.0.1:7460"`, "(from $CSIACTOR_ADDR)")
}

// Flags may come after the positional arguments.
func TestRun_InterspersedFlags(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "volume", "status", "vol1", "-json")
	r.want(t, 0, "")
	r.contains(t, "stdout", `"id": "vol1"`)
}

// Backend errors reach the user with exit code 1 and the agent's message.
func TestRun_AgentError_Exit1(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "volume", "status", "nope")
	r.want(t, 1, "")
	if r.stderr != "csiactor: volume \"nope\" not found\n" {
		t.Errorf("stderr = %q", r.stderr)
	}
}

// startCLI runs the command line in a goroutine (for the agent and
// events -follow) and returns its output buffers and a channel that gets
// the exit code.
func startCLI(ctx context.Context, t *testing.T, env map[string]string, opts []cli.Option, args ...string) (stdout, stderr *syncBuffer, done <-chan int) {
	t.Helper()
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	opts = append([]cli.Option{cli.WithGetenv(func(k string) string { return env[k] })}, opts...)
	ch := make(chan int, 1)
	go func() { ch <- cli.Run(ctx, args, stdout, stderr, opts...) }()
	return stdout, stderr, ch
}

// waitFor polls cond until it holds, failing after 20 s. It waits for
// another goroutine's progress; it measures nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exitCode waits for a started command's exit code.
func exitCode(t *testing.T, done <-chan int) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(60 * time.Second):
		t.Fatal("command did not exit within 60s")
	}
	return -1
}

// A client command interrupted while it waits for the agent says so, and
// that the agent goes on, instead of "context canceled".
func TestRun_Interrupted_Message(t *testing.T) {
	_, env := populated(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := runCLIContext(ctx, t, env, nil, "volume", "claim", "-alloc", "web-2", "-mode", "read", "-access-mode", "multi-node-multi-writer", "-attachment-mode", "block-device", "vol2")
	r.want(t, 1, "")
	if !strings.HasPrefix(r.stderr, "csiactor: interrupted; the agent carries on") {
		t.Errorf("stderr = %q", r.stderr)
	}
}
