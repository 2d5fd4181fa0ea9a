package cli

import (
	"flag"
	"strings"

	"github.com/csiactor/csiactor/actors/plugin/container"
)

// allocImageFlags are the flags of `alloc register` that make an image
// allocation.
type allocImageFlags struct {
	image, engine, pull              string
	caps, devices, mounts            listFlag
	privileged, hostNetwork, hostPID bool
}

// imageFlags defines the image flags on fs.
func imageFlags(fs *flag.FlagSet) *allocImageFlags {
	f := &allocImageFlags{}
	fs.StringVar(&f.image, "image", "", "run the plugin in a container of this image `reference`")
	fs.StringVar(&f.engine, "engine", "", "container `engine` of -image: docker (default) or podman")
	fs.StringVar(&f.pull, "pull", "", "pull `policy` of -image: missing (default), always or never")
	fs.Var(&f.caps, "cap", "`capability` to add to the container (repeatable; default SYS_ADMIN for node and monolith; none for none)")
	fs.Var(&f.devices, "device", "host device `path` given to the container (repeatable)")
	fs.Var(&f.mounts, "mount", "bind mount `SRC:DST[:ro]` of absolute paths into the container (repeatable)")
	fs.BoolVar(&f.privileged, "privileged", false, "run the container privileged")
	fs.BoolVar(&f.hostNetwork, "host-network", false, "run the container in the host's network namespace")
	fs.BoolVar(&f.hostPID, "host-pid", false, "run the container in the host's PID namespace")
	return f
}

// imageOnly are the flags that only an image allocation takes.
var imageOnly = []string{"image", "engine", "pull", "cap", "device", "mount", "privileged", "host-network", "host-pid"}

// given reports whether any image flag was set on the command line.
func (f *allocImageFlags) given(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(fl *flag.Flag) {
		for _, n := range imageOnly {
			set = set || fl.Name == n
		}
	})
	return set
}

// build builds the image object, args being the container's arguments
// (after "--") and env its environment. A malformed -mount is a usage
// error naming it; the rest is checked by the allocation's validation.
func (f *allocImageFlags) build(fs *flag.FlagSet, args []string, env map[string]string) (*container.Image, error) {
	if f.image == "" {
		return nil, usagef("-image is required with %s", "-engine, -pull, -cap, -device, -mount, -privileged, -host-network and -host-pid")
	}
	im := &container.Image{Image: f.image, Engine: f.engine, Pull: f.pull, Args: args, Env: env, Devices: f.devices,
		Privileged: f.privileged, HostNetwork: f.hostNetwork, HostPID: f.hostPID}
	capsSet := false
	fs.Visit(func(fl *flag.Flag) { capsSet = capsSet || fl.Name == "cap" })
	if capsSet {
		im.Capabilities = []string{}
		for _, c := range f.caps {
			if c != "none" {
				im.Capabilities = append(im.Capabilities, c)
			}
		}
	}
	for i, m := range f.mounts {
		parts := strings.Split(m, ":")
		if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "ro") {
			return nil, usagef("-mount #%d: %q: want SRC:DST or SRC:DST:ro", i+1, m)
		}
		im.Mounts = append(im.Mounts, container.Mount{Source: parts[0], Target: parts[1], ReadOnly: len(parts) == 3})
	}
	return im, nil
}
