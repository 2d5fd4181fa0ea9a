package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/csiactor/csiactor/runtime"
)

// flagNames maps the request fields that runtime validation names to the
// command line flags (or positional arguments) they come from. A key is a
// field path without list indexes ("capabilities.access_mode"); the
// longest key that is a prefix of the field at a dot wins.
type flagNames map[string]string

// Field-to-flag maps of the commands that build requests from flags.
var (
	claimFlagNames = flagNames{
		"alloc": "-alloc", "mode": "-mode",
		"access_mode": "-access-mode", "attachment_mode": "-attachment-mode",
		"ephemeral": "-ephemeral", "ephemeral.plugin": "-ephemeral", "ephemeral.capacity_bytes": "-ephemeral-capacity",
		"ephemeral.parameters": "-ephemeral-parameter", "ephemeral.capability": "-ephemeral-fs-type/-ephemeral-mount-flag",
		"ephemeral.capability.fs_type": "-ephemeral-fs-type", "ephemeral.capability.mount_flags": "-ephemeral-mount-flag",
		"ephemeral.capability.access_mode": "-access-mode", "ephemeral.capability.attachment_mode": "-attachment-mode",
		"read_only": "-read-only", "mount_flags": "-mount-flag", "mount_group": "-mount-group",
		"selinux_context": "-selinux-context",
	}
	volumeFlagNames = flagNames{
		"id": "ID", "plugin": "-plugin", "external_id": "-external-id",
		"capacity_bytes": "-capacity", "topology": "-topology", "content_source.volume": "-clone-of",
		"content_source.snapshot": "-from-snapshot", "content_source": "-clone-of/-from-snapshot",
		"capabilities":  "-capability",
		"mount_options": "-fs-type/-mount-flag", "mount_options.fs_type": "-fs-type",
		"mount_options.mount_flags": "-mount-flag",
		"parameters":                "-parameter", "context": "-context", "secrets": "-secret/-secrets-file",
	}
	allocFlagNames = flagNames{
		"plugin": "-plugin", "type": "-type", "socket": "-socket",
		"command": "COMMAND", "env": "-env",
		"image": "-image", "image.image": "-image", "image.engine": "-engine", "image.pull": "-pull",
		"image.args": "ARG", "image.env": "-env", "image.capabilities": "-cap", "image.devices": "-device",
		"image.mounts": "-mount",
	}
)

// usageFromField turns the validation error of a request built from flags
// into a usage error (exit code 2) that names the flag instead of the API
// field: `-capability #2: ...` rather than `capabilities[1].access_mode:
// ...`. The agent validates the same way; checking first spares a round
// trip and keeps a command line mistake a usage error. Errors that are not
// a *runtime.FieldError, and nil, come back as they are.
func usageFromField(err error, names flagNames) error {
	var fe *runtime.FieldError
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	// Split "capabilities[1].access_mode" into its path without indexes
	// and the first index.
	var path strings.Builder
	index := -1
	for f := fe.Field; f != ""; {
		i := strings.IndexByte(f, '[')
		if i < 0 {
			path.WriteString(f)
			break
		}
		path.WriteString(f[:i])
		j := strings.IndexByte(f[i:], ']')
		if j < 0 {
			path.WriteString(f[i:])
			break
		}
		if n, err := strconv.Atoi(f[i+1 : i+j]); err == nil && index < 0 {
			index = n
		}
		f = f[i+j+1:]
	}
	name := ""
	for key := path.String(); key != ""; {
		if n, ok := names[key]; ok {
			name = n
			break
		}
		i := strings.LastIndexByte(key, '.')
		if i < 0 {
			break
		}
		key = key[:i]
	}
	if name == "" {
		return usagef("%s", fe.Error())
	}
	if index >= 0 && strings.HasPrefix(name, "-") && !strings.Contains(name, "/") {
		name = fmt.Sprintf("%s #%d", name, index+1)
	}
	return usagef("%s: %s", name, fe.Msg)
}

// checkID checks a positional ID argument (a volume, allocation or plugin
// name) the way the agent does, as a usage error naming the argument.
func checkID(arg, id string) error {
	if err := runtime.ValidateID(arg, id); err != nil {
		return usagef("%s", err.Error())
	}
	return nil
}

// wantID checks that args is the one ID argument name (as wantArgs) and
// that it is a valid ID (as checkID).
func wantID(args []string, name string) error {
	if err := wantArgs(args, name); err != nil {
		return err
	}
	return checkID(name, args[0])
}
