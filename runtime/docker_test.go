package runtime

import (
	"strings"
	"testing"
	"time"
)

func TestParseConfig_Docker(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
docker:
  drivers:
    - name: csi
      plugin: hostpath
      defaults:
        access_mode: single-node-multi-writer
        capacity: 10GiB
        mount_flags: [noatime]
        parameters: {tier: fast}
        secrets: {token: s3cret}
  engines: [/run/docker.sock]
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Docker == nil || cfg.Docker.PluginDir != "" {
		t.Fatalf("parsed docker = %+v", cfg.Docker)
	}
	d := cfg.WithDefaults().Docker // as the runtime takes it
	if d.PluginDir != DefaultDockerPluginDir || d.ReconcileInterval != DefaultDockerReconcileInterval ||
		d.UnmountGrace != DefaultDockerUnmountGrace || len(d.Drivers) != 1 || len(d.Engines) != 1 {
		t.Fatalf("docker = %+v", d)
	}
	dd := d.Drivers[0].Defaults
	if dd.AccessMode != "single-node-multi-writer" || dd.Capacity != "10GiB" || dd.Secrets["token"] != "s3cret" || dd.Parameters["tier"] != "fast" {
		t.Errorf("defaults = %+v", dd)
	}
	if none, err := ParseConfig([]byte("data_dir: /d\n")); err != nil || none.Docker != nil {
		t.Errorf("without a docker section: %+v, %v", none.Docker, err)
	}
}

func TestDockerConfig_Validate(t *testing.T) {
	ok := func() *DockerConfig {
		return &DockerConfig{Drivers: []DockerDriver{{Name: "csi", Plugin: "p"}}}
	}
	for _, tc := range []struct {
		name string
		mod  func(*DockerConfig)
		want string
	}{
		{"no drivers", func(c *DockerConfig) { c.Drivers = nil }, "docker.drivers: give at least one"},
		{"relative dir", func(c *DockerConfig) { c.PluginDir = "run/plugins" }, `docker.plugin_dir: "run/plugins" is not an absolute path`},
		{"unclean dir", func(c *DockerConfig) { c.PluginDir = "/run//plugins/" }, "docker.plugin_dir"},
		{"bad name", func(c *DockerConfig) { c.Drivers[0].Name = "my driver" }, "docker.drivers[0].name"},
		{"duplicate name", func(c *DockerConfig) { c.Drivers = append(c.Drivers, c.Drivers[0]) }, `docker.drivers[1].name: "csi" is also the name of docker.drivers[0]`},
		{"no plugin", func(c *DockerConfig) { c.Drivers[0].Plugin = "" }, "docker.drivers[0].plugin: must not be empty"},
		{"long socket", func(c *DockerConfig) { c.PluginDir = "/" + strings.Repeat("d", 100) }, "over the 107-byte unix socket limit"},
		{"access mode", func(c *DockerConfig) { c.Drivers[0].Defaults.AccessMode = "everyone" }, "docker.drivers[0].defaults.access_mode"},
		{"attachment mode", func(c *DockerConfig) { c.Drivers[0].Defaults.AttachmentMode = "disk" }, "docker.drivers[0].defaults.attachment_mode"},
		{"fs type", func(c *DockerConfig) { c.Drivers[0].Defaults.FSType = "ext4;rm" }, "docker.drivers[0].defaults.fs_type"},
		{"mount flag", func(c *DockerConfig) { c.Drivers[0].Defaults.MountFlags = []string{""} }, "docker.drivers[0].defaults.mount_flags[0]"},
		{"capacity", func(c *DockerConfig) { c.Drivers[0].Defaults.Capacity = "lots" }, "docker.drivers[0].defaults.capacity"},
		{"secret", func(c *DockerConfig) { c.Drivers[0].Defaults.Secrets = map[string]string{"k": "a\x00b"} }, "docker.drivers[0].defaults.secrets"},
		{"engine", func(c *DockerConfig) { c.Engines = []string{"docker.sock"} }, "docker.engines[0]"},
		{"interval", func(c *DockerConfig) { c.ReconcileInterval = -time.Second }, "docker.reconcile_interval: -1s is negative"},
		{"grace", func(c *DockerConfig) { c.UnmountGrace = -time.Second }, "docker.unmount_grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.mod(c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "a\x00b") {
				t.Errorf("the error shows a secret: %v", err)
			}
		})
	}
	if err := ok().Validate(); err != nil {
		t.Errorf("a good config: %v", err)
	}
	var none *DockerConfig
	if err := none.Validate(); err != nil {
		t.Errorf("nil: %v", err)
	}
}
