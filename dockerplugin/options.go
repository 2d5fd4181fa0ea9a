package dockerplugin

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/runtime"
)

// Create options: the names of Swarm's cluster-volume flags.
const (
	optSize             = "size"
	optType             = "type"
	optSharing          = "sharing"
	optScope            = "scope"
	optFSType           = "fs-type"
	optTopologyRequired = "topology-required"
	optExternalID       = "external-id"
	// contextPrefix marks a volume context entry of a registered volume.
	contextPrefix = "context."
)

var knownOptions = []string{optSize, optType, optSharing, optScope, optFSType, optTopologyRequired, optExternalID}

// nearMisses are names users may write for an option; each is refused
// with the option's name rather than passed on as a CSI parameter.
var nearMisses = map[string]string{
	"capacity": optSize, "capacity-bytes": optSize, "required-bytes": optSize,
	"fstype": optFSType, "filesystem": optFSType,
	"topology": optTopologyRequired, "externalid": optExternalID, "volume-id": optExternalID,
	"access-mode": optSharing, "attachment-mode": optType,
}

// optionError is a bad create option; the engine shows its text.
func optionError(format string, a ...any) error {
	return fmt.Errorf("%w: %s", runtime.ErrInvalid, fmt.Sprintf(format, a...))
}

// createSpec turns the options of a Create of volume name into what the
// runtime takes: a create spec, or, with external-id, a register spec
// (spec.ExternalID set). Options win over drv's defaults.
func createSpec(drv runtime.DockerDriver, name string, opts map[string]string) (runtime.CreateVolumeSpec, error) {
	d := drv.Defaults
	spec := runtime.CreateVolumeSpec{ID: name}
	spec.Plugin = drv.Plugin
	params := maps.Clone(d.Parameters)
	var ctxEntries map[string]string
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		if err := checkKey(k); err != nil {
			return spec, err
		}
		switch {
		case k == optExternalID:
			if opts[k] == "" {
				return spec, optionError("option %s: give the plugin's ID of the existing volume", k)
			}
			spec.ExternalID = opts[k]
		case strings.HasPrefix(k, contextPrefix):
			if ctxEntries == nil {
				ctxEntries = map[string]string{}
			}
			ctxEntries[strings.TrimPrefix(k, contextPrefix)] = opts[k]
		case !isKnown(k):
			if params == nil {
				params = map[string]string{}
			}
			params[k] = opts[k]
		}
	}
	spec.Parameters = params

	capability, err := capabilityOf(d, opts)
	if err != nil {
		return spec, err
	}
	spec.Capabilities = []runtime.Capability{capability}
	fsType := d.FSType
	if v, ok := opts[optFSType]; ok {
		if capability.AttachmentMode != csi.AttachmentModeFileSystem.String() {
			return spec, optionError("option %s applies to type=mount only", optFSType)
		}
		if v == "" {
			return spec, optionError("option %s is empty; give a file-system type like ext4", optFSType)
		}
		fsType = v
	}
	if capability.AttachmentMode == csi.AttachmentModeFileSystem.String() && (fsType != "" || len(d.MountFlags) > 0) {
		spec.MountOptions = &runtime.MountOptions{FSType: fsType, MountFlags: append([]string(nil), d.MountFlags...)}
	}
	if len(d.Secrets) > 0 {
		spec.Secrets = maps.Clone(d.Secrets)
	}

	if spec.ExternalID != "" {
		for _, k := range []string{optSize, optTopologyRequired} {
			if _, ok := opts[k]; ok {
				return spec, optionError("option %s does not apply with %s (the volume exists already)", k, optExternalID)
			}
		}
		spec.Context = ctxEntries
		return spec, validateSpec(spec.VolumeSpec.Validate())
	}
	if len(ctxEntries) > 0 {
		return spec, optionError("options %s* apply with %s only (a created volume's context comes from the plugin)", contextPrefix, optExternalID)
	}
	size := d.Capacity
	if v, ok := opts[optSize]; ok {
		size = v
	}
	if size != "" {
		n, err := runtime.ParseSize(size)
		if err != nil {
			return spec, optionError("option %s: %s", optSize, err.Error())
		}
		spec.CapacityBytes = n
	}
	if v, ok := opts[optTopologyRequired]; ok {
		seg, err := parseSegments(v)
		if err != nil {
			return spec, optionError("option %s: %s", optTopologyRequired, err.Error())
		}
		spec.Topology = []map[string]string{seg}
	}
	return spec, validateSpec(spec.Validate())
}

// validateSpec words the runtime's check of a built spec for the engine;
// every field it checks comes from an option or the driver's defaults.
func validateSpec(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (from the options or the driver's defaults)", err)
}

func isKnown(k string) bool {
	for _, o := range knownOptions {
		if k == o {
			return true
		}
	}
	return false
}

// checkKey refuses option names that are misspelled options or carry
// secrets.
func checkKey(k string) error {
	if k == "" {
		return optionError("an option has an empty name")
	}
	norm := strings.ReplaceAll(strings.ToLower(k), "_", "-")
	if strings.HasPrefix(norm, "secret") {
		return optionError("option %q: secrets are never options, since the engines keep options and print them in inspect; set them in the driver's defaults.secrets, or with `csiactor volume update -secret KEY=VALUE` after create", k)
	}
	if isKnown(k) {
		return nil
	}
	if isKnown(norm) {
		return optionError("unknown option %q; did you mean %q?", k, norm)
	}
	if o, ok := nearMisses[norm]; ok {
		return optionError("unknown option %q; did you mean %q?", k, o)
	}
	return nil
}

// capabilityOf is the volume's capability: from type, sharing and scope
// where given (mapped as swarmkit maps them, but for single-node sharing),
// else the driver's default.
func capabilityOf(d runtime.DockerDefaults, opts map[string]string) (runtime.Capability, error) {
	c := runtime.Capability{AccessMode: d.AccessMode, AttachmentMode: d.AttachmentMode}
	if c.AttachmentMode == "" {
		c.AttachmentMode = csi.AttachmentModeFileSystem.String()
	}
	if c.AccessMode == "" {
		c.AccessMode = csi.AccessModeSingleNodeWriter.String()
	}
	if t, ok := opts[optType]; ok {
		switch t {
		case "mount":
			c.AttachmentMode = csi.AttachmentModeFileSystem.String()
		case "block":
			c.AttachmentMode = csi.AttachmentModeBlockDevice.String()
		default:
			return c, optionError("option %s=%q: want mount or block", optType, t)
		}
	}
	sharing, hasSharing := opts[optSharing]
	scope, hasScope := opts[optScope]
	if !hasSharing && !hasScope {
		return c, nil
	}
	if !hasSharing {
		sharing = "none"
	}
	if !hasScope {
		scope = "single"
	}
	var am csi.AccessMode
	switch scope {
	case "single":
		switch sharing {
		case "none":
			am = csi.AccessModeSingleNodeWriter
		case "onewriter", "all":
			// swarmkit sends SINGLE_NODE_WRITER here and lets its
			// scheduler share the one publish between tasks. Each
			// container's Mount is a claim and a publish of its own, and
			// SINGLE_NODE_WRITER allows one: several containers of one
			// host need SINGLE_NODE_MULTI_WRITER. (A Mount carries no
			// read-only flag, so onewriter cannot be told from all.)
			am = csi.AccessModeSingleNodeMultiWriter
		case "readonly":
			am = csi.AccessModeSingleNodeReaderOnly
		}
	case "multi":
		switch sharing {
		case "none":
			return c, optionError("option %s=none with %s=multi has no CSI access mode; use %s=onewriter (one writer on any node), readonly or all", optSharing, optScope, optSharing)
		case "onewriter":
			am = csi.AccessModeMultiNodeSingleWriter
		case "readonly":
			am = csi.AccessModeMultiNodeReaderOnly
		case "all":
			am = csi.AccessModeMultiNodeMultiWriter
		}
	default:
		return c, optionError("option %s=%q: want single or multi", optScope, scope)
	}
	if am == csi.AccessModeUnknown {
		return c, optionError("option %s=%q: want none, readonly, onewriter or all", optSharing, sharing)
	}
	c.AccessMode = am.String()
	return c, nil
}

// parseSegments parses "zone=a,rack=1" into topology segments.
func parseSegments(s string) (map[string]string, error) {
	seg := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q: want KEY=VALUE[,KEY=VALUE...]", s)
		}
		if _, dup := seg[k]; dup {
			return nil, fmt.Errorf("%q names %s twice", s, k)
		}
		seg[k] = v
	}
	return seg, nil
}
