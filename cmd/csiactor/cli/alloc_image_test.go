package cli_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/runtime"
)

func TestAllocRegister_Image(t *testing.T) {
	b, env := fakeAgent(t)
	r := runCLI(t, env, "alloc", "register", "-plugin", "hostpath.csi.k8s.io", "-type", "monolith",
		"-image", "registry.example/hostpath:v1", "-engine", "podman", "-pull", "never", "-cap", "SYS_ADMIN", "-cap", "MKNOD",
		"-device", "/dev/fuse", "-mount", "/var/lib/hp:/csi-data-dir", "-mount", "/etc/hp:/etc/hp:ro", "-host-network",
		"-env", "A=1", "hp1", "--", "--endpoint={endpoint}", "--nodeid=n1")
	r.want(t, 0, "")
	r.contains(t, "stdout", "Registered allocation hp1 (hostpath.csi.k8s.io monolith)", "image registry.example/hostpath:v1 on podman")
	as, _ := b.Allocations(context.Background())
	if len(as) != 1 || as[0].Image != "registry.example/hostpath:v1" || as[0].Engine != "podman" || len(as[0].Command) != 0 {
		t.Fatalf("backend allocations = %+v", as)
	}
	want := &container.Image{Image: "registry.example/hostpath:v1", Engine: "podman", Pull: "never",
		Args: []string{"--endpoint={endpoint}", "--nodeid=n1"}, Env: map[string]string{"A": "1"},
		Capabilities: []string{"SYS_ADMIN", "MKNOD"}, Devices: []string{"/dev/fuse"},
		Mounts:      []container.Mount{{Source: "/var/lib/hp", Target: "/csi-data-dir"}, {Source: "/etc/hp", Target: "/etc/hp", ReadOnly: true}},
		HostNetwork: true}
	// The same definition again is a no-op: the backend compares specs.
	runCLI(t, env, "alloc", "register", "-plugin", "hostpath.csi.k8s.io", "-type", "monolith",
		"-image", "registry.example/hostpath:v1", "-engine", "podman", "-pull", "never", "-cap", "SYS_ADMIN", "-cap", "MKNOD",
		"-device", "/dev/fuse", "-mount", "/var/lib/hp:/csi-data-dir", "-mount", "/etc/hp:/etc/hp:ro", "-host-network",
		"-env", "A=1", "hp1", "--", "--endpoint={endpoint}", "--nodeid=n1").want(t, 0, "")
	if got, _ := b.AllocationSpec("hp1"); !reflect.DeepEqual(got, runtime.AllocationSpec{Plugin: "hostpath.csi.k8s.io", Type: "monolith", Image: want}) {
		t.Errorf("registered %+v, want image %+v", got, want)
	}

	// -cap none: no capability at all (an empty list, not the default).
	runCLI(t, env, "alloc", "register", "-plugin", "p", "-type", "node", "-image", "img", "-cap", "none", "hp2").want(t, 0, "")
	if got, _ := b.AllocationSpec("hp2"); got.Image == nil || got.Image.Capabilities == nil || len(got.Image.Capabilities) != 0 {
		t.Errorf("registered %+v, want an empty capability list", got.Image)
	}
}

func TestAllocRegister_ImageErrors(t *testing.T) {
	b, env := fakeAgent(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown engine", []string{"-image", "img", "-engine", "rkt"}, `-engine: "rkt" is not an engine: want docker or podman`},
		{"unknown pull", []string{"-image", "img", "-pull", "sometimes"}, `-pull: "sometimes" is not a pull policy`},
		{"relative mount", []string{"-image", "img", "-mount", "data:/data"}, `-mount #1: "data" is a relative path`},
		{"mount without target", []string{"-image", "img", "-mount", "/data"}, `-mount #1: "/data": want SRC:DST or SRC:DST:ro`},
		{"relative device", []string{"-image", "img", "-device", "fuse"}, `-device #1: "fuse" is a relative path`},
		{"bad capability", []string{"-image", "img", "-cap", "SYS ADMIN"}, `-cap #1: "SYS ADMIN" is not a Linux capability`},
		// A name the engine would refuse only at each start.
		{"unknown capability", []string{"-image", "img", "-cap", "SYS_ADMIN", "-cap", "FOO_BAR"}, `-cap #2: "FOO_BAR" is not a Linux capability`},
		{"image and socket", []string{"-image", "img", "-socket", "/s"}, "-image: give one of socket"},
		{"engine without image", []string{"-engine", "docker"}, "-image is required with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, env, append(append([]string{"alloc", "register", "-plugin", "p", "-type", "node"}, tc.args...), "a")...)
			r.want(t, 2, "")
			r.contains(t, "stderr", tc.want)
			if as, _ := b.Allocations(context.Background()); len(as) != 0 {
				t.Errorf("registered %+v", as)
			}
		})
	}
}

func TestAllocListAndStatus_Image(t *testing.T) {
	b, env := populated(t)
	if _, err := b.RegisterAllocation(context.Background(), "img1", runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeNode,
		Image: &container.Image{Image: "registry.example/hp:v1"}}); err != nil {
		t.Fatal(err)
	}
	b.SetContainer("img1", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210")
	r := runCLI(t, env, "alloc", "list")
	r.want(t, 0, "")
	lines := strings.Split(r.stdout, "\n")
	if f := strings.Fields(lines[0]); !reflect.DeepEqual(f[len(f)-5:], []string{"ENGINE", "IMAGE", "DIGEST", "CONTAINER", "DESCRIPTION"}) {
		t.Errorf("header %q: want ENGINE IMAGE DIGEST CONTAINER before DESCRIPTION", lines[0])
	}
	r.contains(t, "stdout", "docker  registry.example/hp:v1  sha256:0123456789ab  fedcba987654  healthy")

	r = runCLI(t, env, "alloc", "status", "img1")
	r.want(t, 0, "")
	r.contains(t, "stdout", "Image:        registry.example/hp:v1\n", "Engine:       docker\n",
		"Digest:       sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n", "Container:    fedcba9876543210fedcba9876543210\n")
	r = runCLI(t, env, "alloc", "status", "-json", "img1")
	var a runtime.Allocation
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil || a.ContainerID != "fedcba9876543210fedcba9876543210" || a.Engine != "docker" {
		t.Errorf("alloc status -json = %+v, %v", a, err)
	}
	r = runCLI(t, env, "alloc", "status", "nfs-node")
	r.want(t, 0, "")
	r.contains(t, "stdout", "Command:      /bin/nfs\n", "PID:          -\n")
	r = runCLI(t, env, "alloc", "status", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `allocation "nope" is not registered`)
	runCLI(t, env, "alloc", "status").want(t, 2, "")
}
