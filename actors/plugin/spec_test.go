package plugin

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/internal/actorkit"
)

func TestSpec_Validate(t *testing.T) {
	ok := Spec{ID: "a-1.x_y", Plugin: "csi.example.com", Type: Node, Socket: "/run/csi.sock"}
	tests := []struct {
		name  string
		mod   func(*Spec)
		field string // "" means valid
	}{
		{"attached", func(*Spec) {}, ""},
		{"unix endpoint", func(s *Spec) { s.Socket = "unix:///run/csi.sock" }, ""},
		{"exec", func(s *Spec) {
			s.Socket = ""
			s.Command = []string{"sh", "{endpoint}"}
			s.Env = map[string]string{"A": "1"}
		}, ""},
		{"exec absolute", func(s *Spec) { s.Socket = ""; s.Command = []string{"/opt/not/installed/yet"} }, ""},
		{"exec relative", func(s *Spec) { s.Socket = ""; s.Command = []string{"relative/cmd"} }, `command[0] "relative/cmd" is a relative path`},
		{"exec dot relative", func(s *Spec) { s.Socket = ""; s.Command = []string{"./cmd"} }, `command[0] "./cmd" is a relative path`},
		{"exec name not in PATH", func(s *Spec) { s.Socket = ""; s.Command = []string{"csiactor-no-such-plugin"} },
			`command[0] "csiactor-no-such-plugin" is not found in the agent's PATH`},
		{"monolith", func(s *Spec) { s.Type = Monolith }, ""},
		{"no id", func(s *Spec) { s.ID = "" }, "id is required"},
		{"id with slash", func(s *Spec) { s.ID = "a/b" }, "id"},
		{"id dot-dot", func(s *Spec) { s.ID = ".." }, "id"},
		{"id too long", func(s *Spec) { s.ID = strings.Repeat("a", 65) }, "id is 65 bytes"},
		{"no plugin", func(s *Spec) { s.Plugin = "" }, "plugin is required"},
		{"plugin with space", func(s *Spec) { s.Plugin = "a b" }, "plugin"},
		{"bad type", func(s *Spec) { s.Type = "Node" }, "type"},
		{"neither", func(s *Spec) { s.Socket = "" }, "socket, command or image"},
		{"image", func(s *Spec) { s.Socket = ""; s.Image = &container.Image{Image: "csi/x:1", Engine: "podman"} }, ""},
		{"image and command", func(s *Spec) { s.Socket = ""; s.Command = []string{"/bin/p"}; s.Image = &container.Image{Image: "i"} }, "image and command are both set"},
		{"image unknown engine", func(s *Spec) { s.Socket = ""; s.Image = &container.Image{Image: "i", Engine: "rkt"} }, `image.engine: "rkt" is not an engine`},
		{"image relative mount", func(s *Spec) {
			s.Socket = ""
			s.Image = &container.Image{Image: "i", Mounts: []container.Mount{{Source: "/a", Target: "b"}}}
		}, `image.mounts[0].target: "b" is a relative path`},
		{"image capabilities", func(s *Spec) {
			s.Socket = ""
			s.Image = &container.Image{Image: "i", Capabilities: []string{"sys_admin", "CAP_MKNOD", "ALL", "CHECKPOINT_RESTORE"}}
		}, ""},
		{"image unknown capability", func(s *Spec) {
			s.Socket = ""
			s.Image = &container.Image{Image: "i", Capabilities: []string{"SYS_ADMIN", "SYS_ADMN"}}
		}, `image.capabilities[1]: "SYS_ADMN" is not a Linux capability`},
		{"relative socket", func(s *Spec) { s.Socket = "run/csi.sock" }, "socket"},
		{"tcp socket", func(s *Spec) { s.Socket = "tcp://host:1" }, "socket"},
		{"long socket", func(s *Spec) { s.Socket = "/" + strings.Repeat("x", 107) }, "107"},
		{"empty command", func(s *Spec) { s.Socket = ""; s.Command = []string{" "} }, "command[0]"},
		{"NUL in arg", func(s *Spec) { s.Socket = ""; s.Command = []string{"sh", "a\x00"} }, "command[1]"},
		{"env without command", func(s *Spec) { s.Env = map[string]string{"A": "1"} }, "env"},
		{"env bad name", func(s *Spec) { s.Socket = ""; s.Command = []string{"sh"}; s.Env = map[string]string{"A=B": "1"} }, "env"},
		{"env CSI_ENDPOINT", func(s *Spec) {
			s.Socket = ""
			s.Command = []string{"sh"}
			s.Env = map[string]string{"CSI_ENDPOINT": "x"}
		}, "CSI_ENDPOINT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.mod(&s)
			err := s.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate() = %v, want ErrInvalidSpec mentioning %q", err, tt.field)
			}
		})
	}
}

func TestSpec_WithSocket(t *testing.T) {
	exec := Spec{ID: "e1", Plugin: "p", Type: Node, Command: []string{"plug", "--endpoint={endpoint}", "{socket}"}, Env: map[string]string{"B": "2", "A": "1"}}
	got, err := exec.WithSocket("/var/lib/csiactor")
	if err != nil {
		t.Fatal(err)
	}
	if got.Socket != "/var/lib/csiactor/plugins/e1/csi.sock" {
		t.Errorf("socket = %q", got.Socket)
	}
	if want := []string{"plug", "--endpoint=unix:///var/lib/csiactor/plugins/e1/csi.sock", "/var/lib/csiactor/plugins/e1/csi.sock"}; !slices.Equal(got.command(), want) {
		t.Errorf("command = %q, want %q", got.command(), want)
	}
	if want := []string{"PATH=/bin", "A=1", "B=2", "CSI_ENDPOINT=unix:///var/lib/csiactor/plugins/e1/csi.sock"}; !slices.Equal(got.environ([]string{"PATH=/bin"}), want) {
		t.Errorf("environ = %q, want %q", got.environ([]string{"PATH=/bin"}), want)
	}
	// Restored records carry the computed socket: accepted again.
	if again, err := got.WithSocket("/var/lib/csiactor"); err != nil || !again.Equal(got) {
		t.Errorf("WithSocket on its own result = %+v, %v", again, err)
	}
	other := exec
	other.Socket = "/elsewhere.sock"
	if _, err := other.WithSocket("/var/lib/csiactor"); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "both") {
		t.Errorf("socket with command: %v, want ErrInvalidSpec", err)
	}
	if _, err := exec.WithSocket("/" + strings.Repeat("d", 100)); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "107") {
		t.Errorf("data dir too deep: %v, want the socket length named", err)
	}
	if _, err := exec.WithSocket("relative"); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("relative data dir: %v", err)
	}
	// WithSocket does not look a bare name up (a restored allocation whose
	// command left PATH is retried, not refused), but a relative path is
	// refused everywhere.
	gone := exec
	gone.Command = []string{"csiactor-no-such-plugin"}
	if _, err := gone.WithSocket("/var/lib/csiactor"); err != nil {
		t.Errorf("WithSocket with a bare name not in PATH: %v", err)
	}
	rel := exec
	rel.Command = []string{"bin/plugin"}
	if _, err := rel.WithSocket("/var/lib/csiactor"); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "command[0]") {
		t.Errorf("WithSocket with a relative command: %v, want ErrInvalidSpec naming command[0]", err)
	}
	att, err := Spec{ID: "a", Plugin: "p", Type: Node, Socket: "unix:///run/x/../csi.sock"}.WithSocket("/unused")
	if err != nil || att.Socket != "/run/csi.sock" {
		t.Errorf("attached WithSocket = %q, %v; want the clean path", att.Socket, err)
	}
}

func TestType_Roles(t *testing.T) {
	tests := []struct {
		typ  Type
		want []Role
	}{
		{Controller, []Role{Controller}},
		{Node, []Role{Node}},
		{Monolith, []Role{Controller, Node}},
		{"other", nil},
	}
	for _, tt := range tests {
		if got := tt.typ.Roles(); !slices.Equal(got, tt.want) {
			t.Errorf("%s.Roles() = %v, want %v", tt.typ, got, tt.want)
		}
	}
	if !Monolith.Serves(Controller) || !Monolith.Serves(Node) || Node.Serves(Controller) {
		t.Error("Serves is wrong")
	}
}

func TestConfig_Validate(t *testing.T) {
	log := logrus.NewEntry(logrus.New())
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"zero with log", Config{Log: log}, ""},
		{"no log", Config{}, "log"},
		{"negative heartbeat", Config{Log: log, HeartbeatInterval: -time.Second}, "heartbeat_interval"},
		{"negative grace", Config{Log: log, StopGrace: -1}, "stop_grace"},
		{"negative crash loop", Config{Log: log, CrashLoopExits: -1}, "crash_loop_exits"},
		{"bad backoff", Config{Log: log, RestartBackoff: actorkit.BackoffConfig{Initial: 2 * time.Second, Max: time.Second}}, "restart_backoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %q", err, tt.field)
			}
		})
	}
	d := Config{Log: log}.withDefaults()
	if d.HeartbeatInterval != 30*time.Second || d.ProbeTimeout != 5*time.Second || d.CrashLoopExits != 3 {
		t.Errorf("defaults = %+v", d)
	}
}
