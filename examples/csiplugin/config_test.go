package csiplugin_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/examples/csiplugin"
)

func TestConfig_Validate(t *testing.T) {
	valid := func() csiplugin.Config {
		c := csiplugin.DefaultConfig()
		c.StateDir = "/var/lib/example"
		c.Endpoint = "unix:///run/example/csi.sock"
		return c
	}
	tests := []struct {
		name      string
		mutate    func(*csiplugin.Config)
		wantField string // "" means valid
	}{
		{"defaults", func(*csiplugin.Config) {}, ""},
		{"zero values besides state dir", func(c *csiplugin.Config) { *c = csiplugin.Config{StateDir: "/x"} }, ""},
		{"bare socket path", func(c *csiplugin.Config) { c.Endpoint = "/run/x.sock" }, ""},
		{"no state dir", func(c *csiplugin.Config) { c.StateDir = "" }, "state_dir"},
		{"tcp endpoint", func(c *csiplugin.Config) { c.Endpoint = "tcp://127.0.0.1:1" }, "endpoint"},
		{"empty unix path", func(c *csiplugin.Config) { c.Endpoint = "unix://" }, "endpoint"},
		{"socket path too long", func(c *csiplugin.Config) { c.Endpoint = "unix:///" + strings.Repeat("a", 107) }, "endpoint"},
		{"bad name", func(c *csiplugin.Config) { c.Name = "-bad name" }, "name"},
		{"name too long", func(c *csiplugin.Config) { c.Name = "a" + strings.Repeat("b", 63) }, "name"},
		{"node id too long", func(c *csiplugin.Config) { c.NodeID = strings.Repeat("n", 193) }, "node_id"},
		{"negative max volumes", func(c *csiplugin.Config) { c.MaxVolumesPerNode = -1 }, "max_volumes_per_node"},
		{"unknown mount mode", func(c *csiplugin.Config) { c.MountMode = "overlay" }, "mount_mode"},
		{"fuse with symlinks", func(c *csiplugin.Config) { c.FUSE, c.MountMode = true, csiplugin.MountModeSymlink }, "fuse"},
		{"fail dead unmount without fuse", func(c *csiplugin.Config) { c.FUSEFailDeadUnmount = true }, "fuse_fail_dead_unmount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, csiplugin.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.wantField)
			}
		})
	}
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"unix:///run/csi.sock", "/run/csi.sock", false},
		{"unix:/run/csi.sock", "/run/csi.sock", false},
		{"/run//csi.sock", "/run/csi.sock", false},
		{"csi.sock", "csi.sock", false},
		{"unix://", "", true},
		{"", "", true},
		{"http://x/csi.sock", "", true},
		{"/" + strings.Repeat("s", 106), "/" + strings.Repeat("s", 106), false},
		{"/" + strings.Repeat("s", 107), "", true},
	}
	for _, tt := range tests {
		got, err := csiplugin.ParseEndpoint(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, csiplugin.ErrInvalidConfig) {
			t.Errorf("ParseEndpoint(%q) error %v is not ErrInvalidConfig", tt.in, err)
		}
	}
}

func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{"unix:///a/b.sock", "unix:x", "/p", "tcp://h:1", "", "unix://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := csiplugin.ParseEndpoint(s)
		if err != nil {
			if !errors.Is(err, csiplugin.ErrInvalidConfig) {
				t.Fatalf("error %v is not ErrInvalidConfig", err)
			}
			return
		}
		if p == "" || len(p) > 107 {
			t.Fatalf("ParseEndpoint(%q) = %q: empty or longer than the unix limit", s, p)
		}
	})
}
