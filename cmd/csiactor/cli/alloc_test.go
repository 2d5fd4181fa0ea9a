package cli_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

func TestAllocList_Table(t *testing.T) {
	_, env := populated(t)
	runCLI(t, env, "alloc", "list").want(t, 0,
		"ID        PLUGIN    TYPE      SOURCE  HEALTHY  SINGLETON  NODE    SOCKET                                       DESCRIPTION\n"+
			"hp1       hostpath  monolith  api     yes      yes        node-1  /run/hp.sock                                 healthy\n"+
			"nfs-node  nfs       node      api     no       yes        node-1  /var/lib/csiactor/plugins/nfs-node/csi.sock  unhealthy: probe: connection refused\n")
	r := runCLI(t, env, "alloc", "list", "-json")
	r.want(t, 0, "")
	var as []runtime.Allocation
	if err := json.Unmarshal([]byte(r.stdout), &as); err != nil || len(as) != 2 || as[1].Command[0] != "/bin/nfs" {
		t.Errorf("alloc list -json = %+v, %v", as, err)
	}
}

func TestAllocRegister_Attached(t *testing.T) {
	b, env := fakeAgent(t)
	runCLI(t, env, "alloc", "register", "-plugin", "hostpath", "-type", "node", "-socket", "/run/hp.sock", "hp-node").
		want(t, 0, "Registered allocation hp-node (hostpath node) at /run/hp.sock\n")
	as, _ := b.Allocations(context.Background())
	if len(as) != 1 || as[0].ID != "hp-node" || as[0].Socket != "/run/hp.sock" {
		t.Errorf("backend allocations = %+v", as)
	}
}

func TestAllocRegister_ExecManaged(t *testing.T) {
	b, env := fakeAgent(t)
	r := runCLI(t, env, "alloc", "register", "-plugin", "nfs", "-type", "monolith", "-env", "A=1", "-env", "B=x=y",
		"-json", "nfs1", "--", "/usr/bin/nfsplugin", "--endpoint={endpoint}", "-v")
	r.want(t, 0, "")
	var a runtime.Allocation
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
		t.Fatalf("stdout: %v\n%s", err, r.stdout)
	}
	wantCmd := []string{"/usr/bin/nfsplugin", "--endpoint={endpoint}", "-v"}
	if !reflect.DeepEqual(a.Command, wantCmd) || !reflect.DeepEqual(a.Env, map[string]string{"A": "1", "B": "x=y"}) {
		t.Errorf("registered %+v", a)
	}
	as, _ := b.Allocations(context.Background())
	if len(as) != 1 || !reflect.DeepEqual(as[0].Command, wantCmd) {
		t.Errorf("backend allocations = %+v", as)
	}
}

func TestAllocRegister_Errors(t *testing.T) {
	_, env := fakeAgent(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no id", []string{"-plugin", "p", "-type", "node", "-socket", "/s"}, 2, "missing ID"},
		{"no plugin", []string{"-type", "node", "-socket", "/s", "a"}, 2, "-plugin is required"},
		{"no type", []string{"-plugin", "p", "-socket", "/s", "a"}, 2, "-type is required"},
		{"no socket or command", []string{"-plugin", "p", "-type", "node", "a"}, 2, "give -socket, -image, or the command after --"},
		{"bad env", []string{"-plugin", "p", "-type", "node", "-env", "NOVALUE", "a", "--", "x"}, 2, "-env: want KEY=VALUE (value not shown)"},
		{"env twice", []string{"-plugin", "p", "-type", "node", "-env", "K=NOVALUE", "-env", "K=x", "a", "--", "x"}, 2, `-env: key "K" given twice`},
		{"bad type", []string{"-plugin", "p", "-type", "worker", "-socket", "/s", "a"}, 2, `csiactor alloc register: -type: "worker": want controller, node or monolith`},
		{"relative socket", []string{"-plugin", "p", "-type", "node", "-socket", "s.sock", "a"}, 2, `-socket: "s.sock" is not an absolute path`},
		{"socket and command", []string{"-plugin", "p", "-type", "node", "-socket", "/s", "a", "--", "/bin/p"}, 2, "-socket: give either socket"},
		{"env with socket", []string{"-plugin", "p", "-type", "node", "-socket", "/s", "-env", "A=b", "a"}, 2, "-env: only valid with command"},
		{"bad plugin", []string{"-plugin", "p/q", "-type", "node", "-socket", "/s", "a"}, 2, `-plugin: "p/q": use letters`},
		{"bad id", []string{"-plugin", "p", "-type", "node", "-socket", "/s", ".."}, 2, `ID: "..": use letters`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, env, append([]string{"alloc", "register"}, tc.args...)...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
			if strings.Contains(r.stderr, "NOVALUE") {
				t.Errorf("stderr shows an -env value: %s", r.stderr)
			}
		})
	}
}

func TestAllocDeregister_Cases(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "alloc", "deregister", "hp1").want(t, 0, "Deregistered allocation hp1\n")
	runCLI(t, env, "alloc", "deregister", "-json", "nfs-node").want(t, 0, "")
	if as, _ := b.Allocations(context.Background()); len(as) != 0 {
		t.Errorf("allocations left: %+v", as)
	}
	r := runCLI(t, env, "alloc", "deregister", "hp1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `csiactor: allocation "hp1" not found`)
}

func TestAllocLogs_Cases(t *testing.T) {
	b, env := populated(t)
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	b.AppendLogs("nfs-node",
		runtime.LogLine{Time: t0, Stream: "stdout", Line: "starting"},
		runtime.LogLine{Time: t0, Stream: "stderr", Line: "warning: slow"},
		runtime.LogLine{Time: t0, Stream: "stdout", Line: "serving"})
	r := runCLI(t, env, "alloc", "logs", "nfs-node")
	r.want(t, 0, "starting\nserving\n")
	if r.stderr != "warning: slow\n" {
		t.Errorf("stderr %q, want the plugin's stderr line", r.stderr)
	}
	runCLI(t, env, "alloc", "logs", "-tail", "1", "nfs-node").want(t, 0, "serving\n")
	runCLI(t, env, "alloc", "logs", "-json", "-tail", "1", "nfs-node").
		want(t, 0, `{"time":"2026-03-04T05:06:07Z","stream":"stdout","line":"serving"}`+"\n")

	r = runCLI(t, env, "alloc", "logs", "hp1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `csiactor: allocation "hp1" has no logs: it is attached`)
	r = runCLI(t, env, "alloc", "logs", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `csiactor: allocation "nope" not found`)
	r = runCLI(t, env, "alloc", "logs", "-tail", "-2", "nfs-node")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-tail -2: want 0 or more lines")
	runCLI(t, env, "alloc", "logs").want(t, 2, "")

	// -f prints the tail, then new lines, and ends when the allocation is
	// deregistered.
	done := make(chan result, 1)
	go func() { done <- runCLI(t, env, "alloc", "logs", "-f", "-tail", "0", "nfs-node") }()
	waitFor(t, "the follow in place", func() bool { return b.Following("nfs-node") == 1 })
	b.AppendLogs("nfs-node", runtime.LogLine{Time: t0, Stream: "stdout", Line: "later"})
	if err := b.DeregisterAllocation(context.Background(), "nfs-node"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		r.want(t, 0, "later\n")
	case <-time.After(30 * time.Second):
		t.Fatal("alloc logs -f did not end after the deregistration")
	}
}
