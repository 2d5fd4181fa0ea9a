package runtime

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Defaults of the docker section.
const (
	// DefaultDockerPluginDir is where Docker (and Podman, with
	// volume_plugins set) look for volume plugin sockets.
	DefaultDockerPluginDir = "/run/docker/plugins"
	// DefaultDockerReconcileInterval is how often the agent compares its
	// Docker mounts with the containers the engines run.
	DefaultDockerReconcileInterval = time.Minute
	// DefaultDockerUnmountGrace is how long a claim outlives the last
	// Unmount of its mount ID: Docker unmounts and mounts a new volume
	// again at once when it copies an image's content into it.
	DefaultDockerUnmountGrace = 10 * time.Second
)

// DefaultDockerEngines are the API sockets of Docker and rootful Podman;
// with docker.engines left out, the agent reconciles with each from when
// its socket appears.
var DefaultDockerEngines = []string{"/run/docker.sock", "/run/podman/podman.sock"}

// DockerConfig turns on the Docker volume plugin protocol: for each driver
// the agent serves <plugin_dir>/<name>.sock, and Docker or Podman
// (`docker volume create -d NAME`, `docker run -v VOLUME:/path`) create,
// mount and remove volumes of the driver's CSI plugin through it. Package
// dockerplugin serves it.
type DockerConfig struct {
	// PluginDir is where the driver sockets are made
	// (DefaultDockerPluginDir).
	PluginDir string `yaml:"plugin_dir"`
	// Drivers are the volume drivers to serve, at least one.
	Drivers []DockerDriver `yaml:"drivers"`
	// Engines are the container engines' API sockets (Docker's, Podman's
	// `podman system service`) that the agent asks which containers hold
	// its volumes, so that a mount no container holds any more (dockerd
	// killed, a container killed without Unmount) is released. Every one
	// listed must answer for a check to release anything. Empty: the
	// DefaultDockerEngines, each from when its socket appears.
	Engines []string `yaml:"engines"`
	// ReconcileInterval is how often the mounts are compared with the
	// engines (DefaultDockerReconcileInterval). A mount is released once
	// two checks in a row found no container holding it.
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	// UnmountGrace is how long a claim stays after the last Unmount
	// before it is released (DefaultDockerUnmountGrace).
	UnmountGrace time.Duration `yaml:"unmount_grace"`
}

// DockerDriver is one Docker volume driver, served for one CSI plugin.
type DockerDriver struct {
	// Name is the driver name users give with -d/--driver; the socket is
	// <plugin_dir>/<name>.sock.
	Name string `yaml:"name"`
	// Plugin is the CSI plugin of this agent whose volumes the driver
	// creates and mounts.
	Plugin string `yaml:"plugin"`
	// Defaults are used where `docker volume create` gives no option.
	Defaults DockerDefaults `yaml:"defaults"`
}

// DockerDefaults are a driver's volume settings where `docker volume
// create -o` leaves them out. Secrets are never options (the engines
// print options in `inspect`): volumes created through the driver get
// these.
type DockerDefaults struct {
	// AccessMode and AttachmentMode are the capability, by the CSI names
	// of the API (single-node-writer, file-system); empty: the -o
	// type/sharing/scope defaults, mount, none and single, which are
	// file-system and single-node-writer.
	AccessMode     string `yaml:"access_mode"`
	AttachmentMode string `yaml:"attachment_mode"`
	// FSType and MountFlags are the file-system's mount options.
	FSType     string   `yaml:"fs_type"`
	MountFlags []string `yaml:"mount_flags"`
	// Capacity is the size to create, like "10GiB"; empty lets the plugin
	// choose.
	Capacity string `yaml:"capacity"`
	// Parameters are CSI parameters for CreateVolume; -o KEY=VALUE adds
	// or overrides them.
	Parameters map[string]string `yaml:"parameters"`
	// Secrets are the volume secrets given to the plugin.
	Secrets map[string]string `yaml:"secrets"`
}

func (c *DockerConfig) withDefaults() *DockerConfig {
	if c == nil {
		return nil
	}
	d := *c
	d.Drivers = append([]DockerDriver(nil), c.Drivers...)
	d.Engines = append([]string(nil), c.Engines...)
	setDefault(&d.PluginDir, DefaultDockerPluginDir)
	setDefault(&d.ReconcileInterval, DefaultDockerReconcileInterval)
	setDefault(&d.UnmountGrace, DefaultDockerUnmountGrace)
	return &d
}

// Validate checks c (nil is valid: Docker serving is off); the error is a
// *FieldError naming the bad key, like "docker.drivers[0].name".
func (c *DockerConfig) Validate() error {
	if c == nil {
		return nil
	}
	c = c.withDefaults()
	if err := validateAbsPath("docker.plugin_dir", c.PluginDir); err != nil {
		return err
	}
	if len(c.Drivers) == 0 {
		return fieldErr("docker.drivers", "give at least one {name, plugin}")
	}
	seen := map[string]int{}
	for i, d := range c.Drivers {
		key := fmt.Sprintf("docker.drivers[%d]", i)
		if err := ValidateID(key+".name", d.Name); err != nil {
			return err
		}
		if j, ok := seen[d.Name]; ok {
			return fieldErr(key+".name", fmt.Sprintf("%q is also the name of docker.drivers[%d]", d.Name, j))
		}
		seen[d.Name] = i
		if s := filepath.Join(c.PluginDir, d.Name+".sock"); len(s) > MaxSocketPathLength {
			return fieldErr(key+".name", fmt.Sprintf("the socket %s would be %d bytes, over the %d-byte unix socket limit", s, len(s), MaxSocketPathLength))
		}
		if err := ValidateID(key+".plugin", d.Plugin); err != nil {
			return err
		}
		if err := d.Defaults.validate(key + ".defaults"); err != nil {
			return err
		}
	}
	for i, e := range c.Engines {
		if err := validateAbsPath(fmt.Sprintf("docker.engines[%d]", i), e); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"docker.reconcile_interval", c.ReconcileInterval}, {"docker.unmount_grace", c.UnmountGrace}} {
		if d.v < 0 {
			return fieldErr(d.key, fmt.Sprintf("%s is negative", d.v))
		}
	}
	return nil
}

func (d DockerDefaults) validate(key string) error {
	if d.AccessMode != "" || d.AttachmentMode != "" {
		c := Capability{AccessMode: d.AccessMode, AttachmentMode: d.AttachmentMode}
		if c.AttachmentMode == "" {
			c.AttachmentMode = "file-system"
		}
		if c.AccessMode == "" {
			c.AccessMode = "single-node-writer"
		}
		if _, err := c.Parse(); err != nil {
			return prefixed(key, err)
		}
	}
	if d.FSType != "" && !validFSType(d.FSType) {
		return fieldErr(key+".fs_type", fmt.Sprintf("%q is not a file-system type name", d.FSType))
	}
	for i, f := range d.MountFlags {
		if f == "" || strings.ContainsRune(f, 0) {
			return fieldErr(fmt.Sprintf("%s.mount_flags[%d]", key, i), "must be non-empty and without NUL bytes")
		}
	}
	if d.Capacity != "" {
		if _, err := ParseSize(d.Capacity); err != nil {
			return &FieldError{Field: key + ".capacity", Msg: err.Error(), Err: err}
		}
	}
	if err := validateMap(key+".parameters", d.Parameters, false); err != nil {
		return err
	}
	return validateMap(key+".secrets", d.Secrets, true)
}

// validateAbsPath checks that p is an absolute, clean path without NUL.
func validateAbsPath(key, p string) error {
	switch {
	case strings.ContainsRune(p, 0):
		return fieldErr(key, "must not contain a NUL byte")
	case !filepath.IsAbs(p):
		return fieldErr(key, fmt.Sprintf("%q is not an absolute path", p))
	case filepath.Clean(p) != p:
		return fieldErr(key, fmt.Sprintf("%q is not a clean path; write %q", p, filepath.Clean(p)))
	}
	return nil
}
