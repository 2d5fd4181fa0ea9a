package container

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
)

// Engines the agent can run a plugin's image with.
const (
	Docker = "docker"
	Podman = "podman"
)

// Pull policies of an Image.
const (
	// PullMissing pulls the image only when the engine does not hold it
	// (the default).
	PullMissing = "missing"
	// PullAlways pulls the image before each container is created.
	PullAlways = "always"
	// PullNever never pulls: an image the engine does not hold is an
	// error.
	PullNever = "never"
)

// Default engine API sockets.
const (
	DefaultDockerSocket = "/var/run/docker.sock"
	DefaultPodmanSocket = "/run/podman/podman.sock"
)

// Image makes an allocation container-managed: the agent runs the plugin
// from Image with Engine, through the engine's API socket. The JSON and
// YAML forms are the config file's and the API's "image" object.
type Image struct {
	// Image is the image reference ("registry.example/csi/driver:v1.2").
	Image string `json:"image" yaml:"image"`
	// Engine is Docker (the default) or Podman.
	Engine string `json:"engine,omitempty" yaml:"engine,omitempty"`
	// Args are the container's command arguments (after the image's
	// entrypoint); "{endpoint}" and "{socket}" are replaced as in an
	// exec-managed allocation's command.
	Args []string `json:"args,omitempty" yaml:"args,omitempty"`
	// Env is added to the container's environment, before CSI_ENDPOINT.
	Env map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Capabilities are added to the container ("SYS_ADMIN" or
	// "CAP_SYS_ADMIN"). Nil means the default: SYS_ADMIN for node and
	// monolith allocations, none for controllers; an empty list means
	// none.
	Capabilities []string `json:"capabilities" yaml:"capabilities"`
	// Devices are host device paths given to the container, at the same
	// path ("/dev/fuse").
	Devices []string `json:"devices,omitempty" yaml:"devices,omitempty"`
	// Mounts are bind mounts of host paths, besides those the agent adds
	// (/dev, the socket directory, the volumes directory).
	Mounts []Mount `json:"mounts,omitempty" yaml:"mounts,omitempty"`
	// Privileged runs the container privileged (false by default).
	Privileged bool `json:"privileged,omitempty" yaml:"privileged,omitempty"`
	// Pull is PullMissing (the default), PullAlways or PullNever.
	Pull string `json:"pull,omitempty" yaml:"pull,omitempty"`
	// HostNetwork and HostPID put the container in the host's network and
	// PID namespaces; by default it has its own, with no network.
	HostNetwork bool `json:"host_network,omitempty" yaml:"host_network,omitempty"`
	HostPID     bool `json:"host_pid,omitempty" yaml:"host_pid,omitempty"`
}

// Mount is a bind mount of a host path into the container.
type Mount struct {
	// Source is the absolute host path; Target the absolute path in the
	// container.
	Source string `json:"source" yaml:"source"`
	Target string `json:"target" yaml:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"read_only,omitempty" yaml:"read_only,omitempty"`
}

// FieldError is a bad field of an Image: Field is its path inside the
// image object ("engine", "mounts[0].source").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// EngineName returns the engine, with the default filled in.
func (im Image) EngineName() string {
	if im.Engine == "" {
		return Docker
	}
	return im.Engine
}

// PullPolicy returns the pull policy, with the default filled in.
func (im Image) PullPolicy() string {
	if im.Pull == "" {
		return PullMissing
	}
	return im.Pull
}

// Validate reports the first bad field of im as a *FieldError. It checks
// only what im itself tells: whether the engine holds the image is known
// when the container is created.
func (im Image) Validate() error {
	switch {
	case strings.TrimSpace(im.Image) == "":
		return fieldErr("image", "is required")
	case strings.ContainsAny(im.Image, " \t\n\x00"):
		return fieldErr("image", "%q is not an image reference", im.Image)
	}
	switch im.Engine {
	case "", Docker, Podman:
	default:
		return fieldErr("engine", "%q is not an engine: want docker or podman", im.Engine)
	}
	switch im.Pull {
	case "", PullMissing, PullAlways, PullNever:
	default:
		return fieldErr("pull", "%q is not a pull policy: want missing, always or never", im.Pull)
	}
	for i, a := range im.Args {
		if strings.ContainsRune(a, 0) {
			return fieldErr(fmt.Sprintf("args[%d]", i), "contains a NUL byte")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(im.Env)) {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return fieldErr("env", "bad variable name %q", k)
		case k == "CSI_ENDPOINT":
			return fieldErr("env", "CSI_ENDPOINT is set by the agent")
		case strings.ContainsRune(im.Env[k], 0):
			return fieldErr("env."+k, "contains a NUL byte")
		}
	}
	for i, c := range im.Capabilities {
		if !slices.Contains(capabilityNames, strings.TrimPrefix(strings.ToUpper(c), "CAP_")) {
			return fieldErr(fmt.Sprintf("capabilities[%d]", i), "%q is not a Linux capability (like SYS_ADMIN or CAP_SYS_ADMIN)", c)
		}
	}
	for i, d := range im.Devices {
		if err := absPath(fmt.Sprintf("devices[%d]", i), d); err != nil {
			return err
		}
	}
	for i, m := range im.Mounts {
		if err := absPath(fmt.Sprintf("mounts[%d].source", i), m.Source); err != nil {
			return err
		}
		if err := absPath(fmt.Sprintf("mounts[%d].target", i), m.Target); err != nil {
			return err
		}
	}
	return nil
}

// capabilityNames are the Linux capabilities (capabilities(7)) without
// their CAP_ prefix, and ALL, which the engines take for every one.
var capabilityNames = []string{
	"ALL",
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

func absPath(field, p string) error {
	switch {
	case p == "":
		return fieldErr(field, "is required")
	case !filepath.IsAbs(p):
		return fieldErr(field, "%q is a relative path; give an absolute path", p)
	case strings.ContainsAny(p, ":,\x00"):
		return fieldErr(field, "%q must not contain ':', ',' or NUL", p)
	}
	return nil
}

// Equal reports whether im and o describe the same container.
func (im Image) Equal(o Image) bool {
	eqMounts := slices.Equal(im.Mounts, o.Mounts)
	return im.Image == o.Image && im.EngineName() == o.EngineName() && slices.Equal(im.Args, o.Args) &&
		maps.Equal(im.Env, o.Env) && slices.Equal(im.Capabilities, o.Capabilities) && (im.Capabilities == nil) == (o.Capabilities == nil) &&
		slices.Equal(im.Devices, o.Devices) && eqMounts && im.Privileged == o.Privileged &&
		im.PullPolicy() == o.PullPolicy() && im.HostNetwork == o.HostNetwork && im.HostPID == o.HostPID
}

// Clone returns a deep copy of im.
func (im *Image) Clone() *Image {
	if im == nil {
		return nil
	}
	c := *im
	c.Args = slices.Clone(im.Args)
	c.Env = maps.Clone(im.Env)
	c.Capabilities = slices.Clone(im.Capabilities)
	c.Devices = slices.Clone(im.Devices)
	c.Mounts = slices.Clone(im.Mounts)
	return &c
}
