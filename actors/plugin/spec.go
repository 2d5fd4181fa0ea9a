package plugin

import (
	"errors"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// Type is the kind of an allocation: what services of the plugin it runs.
type Type string

const (
	// Controller is an allocation that runs the controller service.
	Controller Type = "controller"
	// Node is an allocation that runs the node service.
	Node Type = "node"
	// Monolith is an allocation that runs both; it counts as a controller
	// and as a node.
	Monolith Type = "monolith"
)

// Role is one of the two services an allocation can serve: Controller or
// Node (never Monolith).
type Role = Type

// Roles returns the roles an allocation of type t serves: one for
// controller and node, both for monolith.
func (t Type) Roles() []Role {
	switch t {
	case Controller:
		return []Role{Controller}
	case Node:
		return []Role{Node}
	case Monolith:
		return []Role{Controller, Node}
	}
	return nil
}

// Serves reports whether an allocation of type t serves role r.
func (t Type) Serves(r Role) bool { return slices.Contains(t.Roles(), r) }

// ParseType returns the Type named s.
func ParseType(s string) (Type, error) {
	switch t := Type(s); t {
	case Controller, Node, Monolith:
		return t, nil
	}
	return "", kinderr.Errorf(ErrInvalidSpec, "type %q: want controller, node or monolith", s)
}

// Spec is what an allocation is: registered through the config file, the
// API, or restored from the store.
type Spec struct {
	// ID names the allocation; it is used as a directory name, so it is
	// limited to letters, digits, '.', '_' and '-' (at most 64).
	ID string
	// Plugin is the plugin name the allocation belongs to.
	Plugin string
	Type   Type
	// Socket is the plugin's unix socket path. For an attached allocation
	// it is given; for an exec-managed one WithSocket fills it in (given
	// along with a command, it must be that path already).
	Socket string
	// Command makes the allocation exec-managed: the agent runs it. "{endpoint}"
	// and "{socket}" in any element are replaced with the endpoint
	// ("unix://" + socket) and the socket path. Command[0] is an absolute
	// path, or a bare name that the agent's PATH resolves (see Validate);
	// a relative path is refused, as it would depend on the agent's working
	// directory.
	Command []string
	// Env is added to the exec-managed process's environment.
	Env map[string]string
	// Image makes the allocation container-managed: the agent runs the
	// plugin in a container of this image (see package container). Its
	// socket is chosen as for an exec-managed allocation.
	Image *container.Image
}

// ExecManaged reports whether the agent runs the plugin process.
func (s Spec) ExecManaged() bool { return len(s.Command) > 0 }

// ContainerManaged reports whether the agent runs the plugin in a
// container.
func (s Spec) ContainerManaged() bool { return s.Image != nil }

// Managed reports whether the agent runs the plugin, as a process or a
// container, and chooses its socket.
func (s Spec) Managed() bool { return s.ExecManaged() || s.ContainerManaged() }

// Endpoint returns "unix://" + Socket.
func (s Spec) Endpoint() string { return "unix://" + s.Socket }

// Equal reports whether s and o describe the same allocation.
func (s Spec) Equal(o Spec) bool {
	return s.ID == o.ID && s.Plugin == o.Plugin && s.Type == o.Type && s.Socket == o.Socket &&
		slices.Equal(s.Command, o.Command) && maps.Equal(s.Env, o.Env) &&
		(s.Image == nil) == (o.Image == nil) && (s.Image == nil || s.Image.Equal(*o.Image))
}

// SocketPath returns the socket path of an exec-managed allocation:
// <dataDir>/plugins/<id>/csi.sock.
func SocketPath(dataDir, id string) string {
	return filepath.Join(dataDir, "plugins", id, "csi.sock")
}

// WithSocket returns s with Socket set: the normalized given path for an
// attached allocation, SocketPath(dataDir, ID) for an exec-managed one. It
// checks s first, as Validate does except for the PATH lookup of a bare
// command name (so an allocation restored after its command left PATH is
// retried, and its health says why, rather than refused); a path longer
// than the unix socket limit is an error naming the socket.
func (s Spec) WithSocket(dataDir string) (Spec, error) {
	if err := s.validate(); err != nil {
		return s, err
	}
	if s.Managed() {
		if !filepath.IsAbs(dataDir) {
			return s, kinderr.Errorf(ErrInvalidSpec, "data dir %q is not absolute", dataDir)
		}
		want := SocketPath(dataDir, s.ID)
		if s.Socket != "" && s.Socket != want && s.Socket != "unix://"+want {
			return s, kinderr.Errorf(ErrInvalidSpec, "socket and %s are both set: give socket for an attached plugin, command or image for one the agent runs", s.managedKey())
		}
		s.Socket = want
	}
	path, err := csi.ParseEndpoint(s.Socket)
	if err != nil {
		return s, kinderr.Errorf(ErrInvalidSpec, "socket: %w", err)
	}
	s.Socket = path
	return s, nil
}

// Validate reports the first bad field of s, by name. For an exec-managed
// allocation it also looks command[0] up as the agent would run it: an
// absolute path is taken as it is (a missing file shows in the health as
// "failed to start: …"), a bare name must be found in the agent's PATH
// (exec.LookPath), and a relative path such as "bin/plugin" is refused.
// Call it on the agent's host, when the allocation is registered.
func (s Spec) Validate() error {
	if err := s.validate(); err != nil {
		return err
	}
	if !s.ExecManaged() || filepath.IsAbs(s.Command[0]) {
		return nil
	}
	name := s.Command[0]
	if _, err := exec.LookPath(name); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return kinderr.Errorf(ErrInvalidSpec, "command[0] %q is not found in the agent's PATH; give its absolute path", name)
		}
		return kinderr.Errorf(ErrInvalidSpec, "command[0] %q: %w", name, err)
	}
	return nil
}

// validate is Validate without the PATH lookup: what can be told from s
// alone.
func (s Spec) validate() error {
	if err := validName("id", s.ID, 64); err != nil {
		return err
	}
	if err := validName("plugin", s.Plugin, 128); err != nil {
		return err
	}
	if _, err := ParseType(string(s.Type)); err != nil {
		return err
	}
	switch {
	case s.ExecManaged() && s.ContainerManaged():
		return kinderr.Errorf(ErrInvalidSpec, "image and command are both set: give one of socket, command or image")
	case s.Socket == "" && !s.Managed():
		return kinderr.Errorf(ErrInvalidSpec, "socket, command or image is required")
	case s.Socket != "":
		if _, err := csi.ParseEndpoint(s.Socket); err != nil {
			return kinderr.Errorf(ErrInvalidSpec, "socket: %w", err)
		}
	}
	if s.ExecManaged() {
		name := s.Command[0]
		switch {
		case strings.TrimSpace(name) == "":
			return kinderr.Errorf(ErrInvalidSpec, "command[0] is empty")
		case !filepath.IsAbs(name) && strings.ContainsRune(name, '/'):
			return kinderr.Errorf(ErrInvalidSpec, "command[0] %q is a relative path; give an absolute path, or a bare name found in the agent's PATH", name)
		}
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return kinderr.Errorf(ErrInvalidSpec, "command[%d] contains a NUL byte", i)
		}
	}
	if len(s.Env) > 0 && !s.ExecManaged() {
		return kinderr.Errorf(ErrInvalidSpec, "env is only for an allocation with a command (an image has its own image.env)")
	}
	if s.ContainerManaged() {
		if err := s.Image.Validate(); err != nil {
			return kinderr.Errorf(ErrInvalidSpec, "image.%w", err)
		}
	}
	for k, v := range s.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return kinderr.Errorf(ErrInvalidSpec, "env: bad variable name %q", k)
		case k == "CSI_ENDPOINT":
			return kinderr.Errorf(ErrInvalidSpec, "env: CSI_ENDPOINT is set by the agent")
		case strings.ContainsRune(v, 0):
			return kinderr.Errorf(ErrInvalidSpec, "env: %s contains a NUL byte", k)
		}
	}
	return nil
}

func validName(field, v string, max int) error {
	switch {
	case v == "":
		return kinderr.Errorf(ErrInvalidSpec, "%s is required", field)
	case len(v) > max:
		return kinderr.Errorf(ErrInvalidSpec, "%s is %d bytes, at most %d", field, len(v), max)
	case v == "." || v == "..":
		return kinderr.Errorf(ErrInvalidSpec, "%s %q is not a valid name", field, v)
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return kinderr.Errorf(ErrInvalidSpec, "%s %q: only letters, digits, '.', '_' and '-' are allowed", field, v)
		}
	}
	return nil
}

// managedKey names the field that makes s managed: "command" or "image".
func (s Spec) managedKey() string {
	if s.ContainerManaged() {
		return "image"
	}
	return "command"
}

// command returns the command with {endpoint} and {socket} substituted.
func (s Spec) command() []string {
	out := make([]string, len(s.Command))
	r := strings.NewReplacer("{endpoint}", s.Endpoint(), "{socket}", s.Socket)
	for i, a := range s.Command {
		out[i] = r.Replace(a)
	}
	return out
}

// environ returns the process environment: base, then Env, then
// CSI_ENDPOINT, sorted by name within Env so the order is stable.
func (s Spec) environ(base []string) []string {
	env := slices.Clone(base)
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		env = append(env, k+"="+s.Env[k])
	}
	return append(env, "CSI_ENDPOINT="+s.Endpoint())
}
