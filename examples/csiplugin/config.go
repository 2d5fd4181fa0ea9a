package csiplugin

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/sirupsen/logrus"
)

const (
	// DefaultName is the plugin name reported by GetPluginInfo.
	DefaultName = "example.csi.csiactor.dev"
	// TopologyKeyZone is the topology segment key of Config.Zone.
	TopologyKeyZone = "topology.example.csi.csiactor.dev/zone"
	// DefaultVersion is the vendor version reported by GetPluginInfo when
	// Config.Version is empty.
	DefaultVersion = "dev"

	// maxSocketPath is the longest path a unix socket address can hold on
	// Linux (sun_path is 108 bytes including the terminating NUL).
	maxSocketPath = 107
	// maxNodeIDLen is the CSI limit on node_id.
	maxNodeIDLen = 192
)

// nameRE is the CSI rule for a plugin name (domain-name notation, at most
// 63 characters).
var nameRE = regexp.MustCompile(`^[a-zA-Z][A-Za-z0-9.\-_]{0,61}[a-zA-Z0-9]$`)

// MountMode says how the node service makes a volume directory appear at
// the staging and target paths.
type MountMode string

const (
	// MountModeAuto uses bind mounts when the process runs as root and
	// symlinks otherwise. It is what the empty string means.
	MountModeAuto MountMode = "auto"
	// MountModeBind bind-mounts the volume directory onto the staging path
	// and the staging path onto the target, remounting read-only (and with
	// the supported mount flags) where asked. It needs CAP_SYS_ADMIN.
	MountModeBind MountMode = "bind"
	// MountModeSymlink needs no privilege: staging is only recorded, and
	// the target path becomes a symlink to the volume directory. Read-only
	// publishing and mount flags are recorded but not enforced.
	MountModeSymlink MountMode = "symlink"
)

// Config configures a Plugin. Zero values mean defaults (see DefaultConfig).
type Config struct {
	// Endpoint is where the plugin listens: "unix:///abs/path.sock" or a
	// bare socket path. Run needs it; New does not.
	Endpoint string
	// StateDir holds the volumes (StateDir/volumes/<id>) and the state file
	// (StateDir/state.json). It is created if missing. Required.
	StateDir string
	// SharedDir, when set, holds the volumes, the snapshots and the state
	// file instead of StateDir, shared by every instance started with the
	// same SharedDir (each with its own StateDir and NodeID): storage that
	// several hosts reach, as a SAN or a cloud's disks are. Each RPC holds
	// an flock on SharedDir/lock and reads the state file afresh, so the
	// instances may run in different processes. A volume is then
	// controller-published to any node of an instance that shares it, and
	// a single-node volume to one node at a time. StateDir keeps only the
	// instance's own lock. Not with LoseMountsOnStart.
	SharedDir string
	// NodeID is the node id this plugin reports and the only node it
	// accepts in ControllerPublishVolume. Default: the hostname.
	NodeID string
	// Name is the plugin name. Default: DefaultName.
	Name string
	// Version is the vendor version. Default: DefaultVersion.
	Version string
	// MaxVolumesPerNode caps how many volumes may be controller-published
	// to the node at once; 0 means no limit.
	MaxVolumesPerNode int64
	// MaxAttached caps how many volumes the storage lets be
	// controller-published at once, without telling the CO in advance
	// (NodeGetInfo does not report it): a publication beyond it is
	// ResourceExhausted, which a CO retries. 0 means no limit. For tests
	// of a CO's retries.
	MaxAttached int64
	// MountMode picks bind mounts or symlinks. Default: MountModeAuto.
	MountMode MountMode
	// Zone, when set, places the node and every volume it creates in that
	// zone: the plugin announces VOLUME_ACCESSIBILITY_CONSTRAINTS,
	// NodeGetInfo answers the topology {TopologyKeyZone: Zone}, CreateVolume
	// refuses requisite topologies without it (ResourceExhausted), and
	// GetCapacity answers 0 for another zone.
	Zone string
	// Capacity is the storage GetCapacity shares out, in bytes: it answers
	// Capacity less the capacities of the volumes. 0 means the free space
	// of the file system that holds StateDir.
	Capacity int64
	// LoseMountsOnStart makes New undo every staging and publication its
	// state records (unmount, or remove the link) while keeping the
	// records, as a FUSE-backed plugin's mounts die with its process: a
	// plugin restart then leaves the CO's claims without their volumes
	// until it stages and publishes them again. For tests of a CO's
	// repair.
	LoseMountsOnStart bool
	// NoVolumeStats leaves GET_VOLUME_STATS and GET_VOLUME_HEALTH out of
	// the node's capabilities, and NodeGetVolumeStats and
	// NodeGetVolumeHealth answer Unimplemented: a plugin that reports
	// neither a volume's usage nor its condition. For tests of a CO.
	NoVolumeStats bool
	// FUSE makes NodeStageVolume mount the volume directory at the staging
	// path through FUSE, served by this process (the loopback file system
	// of go-fuse, mounted with mount(2), no fusermount); NodePublishVolume
	// bind-mounts the staging onto the target as in MountModeBind. When the
	// process dies, its mounts stay in the mount table and every access
	// fails with ENOTCONN ("transport endpoint is not connected"), as with
	// a real FUSE driver; a new process unmounts such dead mounts on
	// NodeUnpublishVolume and NodeUnstageVolume, and mounts anew on
	// NodeStageVolume. Plugin.Stop does to the mounts what the process's
	// exit does: it aborts their FUSE connections (through the fusectl
	// file system) and leaves them dead. Needs root and /dev/fuse (New
	// says so); not with MountModeSymlink.
	FUSE bool
	// FUSEFailDeadUnmount makes NodeUnpublishVolume and NodeUnstageVolume
	// fail with Internal on a path that holds a dead FUSE mount, instead of
	// unmounting it: for tests of a CO's own cleanup. Needs FUSE.
	FUSEFailDeadUnmount bool
	// Logger receives the plugin's log lines. Default: a logrus logger
	// writing text to stderr at info level.
	Logger *logrus.Entry
	// AcceptedMutableParameters are the mutable parameter names
	// CreateVolume and ControllerModifyVolume (MODIFY_VOLUME) accept; any
	// other is InvalidArgument naming it. The values are recorded, not
	// enforced. Default: DefaultAcceptedMutableParameters.
	AcceptedMutableParameters []string
}

// DefaultAcceptedMutableParameters are the mutable parameter names the
// plugin accepts when Config.AcceptedMutableParameters is empty.
var DefaultAcceptedMutableParameters = []string{"iops", "throughput"}

// DefaultConfig returns a Config with every default filled in except
// Endpoint and StateDir, which have none.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		NodeID:    host,
		Name:      DefaultName,
		Version:   DefaultVersion,
		MountMode: MountModeAuto,
	}
}

// withDefaults returns c with zero values replaced by defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.NodeID == "" {
		c.NodeID = d.NodeID
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	if c.Version == "" {
		c.Version = d.Version
	}
	if c.MountMode == "" {
		c.MountMode = d.MountMode
	}
	if len(c.AcceptedMutableParameters) == 0 {
		c.AcceptedMutableParameters = DefaultAcceptedMutableParameters
	}
	if c.Logger == nil {
		l := logrus.New()
		l.SetOutput(os.Stderr)
		c.Logger = logrus.NewEntry(l)
	}
	return c
}

// Validate reports the first field that cannot work, wrapped in
// ErrInvalidConfig. Empty fields with defaults are valid; Endpoint is
// checked only when set (Run requires it).
func (c Config) Validate() error {
	if c.Endpoint != "" {
		if _, err := ParseEndpoint(c.Endpoint); err != nil {
			return err
		}
	}
	if c.StateDir == "" {
		return fmt.Errorf("%w: state_dir is required", ErrInvalidConfig)
	}
	if c.Name != "" && !nameRE.MatchString(c.Name) {
		return fmt.Errorf("%w: name %q: want at most 63 characters of letters, digits, '.', '-', '_', starting with a letter", ErrInvalidConfig, c.Name)
	}
	if len(c.NodeID) > maxNodeIDLen {
		return fmt.Errorf("%w: node_id is %d bytes, limit %d", ErrInvalidConfig, len(c.NodeID), maxNodeIDLen)
	}
	if len(c.Zone) > 63 {
		return fmt.Errorf("%w: zone is %d bytes, limit 63", ErrInvalidConfig, len(c.Zone))
	}
	if c.SharedDir != "" {
		if filepath.Clean(c.SharedDir) == filepath.Clean(c.StateDir) {
			return fmt.Errorf("%w: shared_dir %q is the state dir; give each instance its own state dir", ErrInvalidConfig, c.SharedDir)
		}
		if c.LoseMountsOnStart {
			return fmt.Errorf("%w: lose_mounts_on_start cannot be used with shared_dir (it would undo the other instances' mounts)", ErrInvalidConfig)
		}
	}
	if c.Capacity < 0 {
		return fmt.Errorf("%w: capacity %d is negative", ErrInvalidConfig, c.Capacity)
	}
	if c.MaxAttached < 0 {
		return fmt.Errorf("%w: max_attached %d is negative", ErrInvalidConfig, c.MaxAttached)
	}
	if c.MaxVolumesPerNode < 0 {
		return fmt.Errorf("%w: max_volumes_per_node %d is negative", ErrInvalidConfig, c.MaxVolumesPerNode)
	}
	if c.FUSE && c.MountMode == MountModeSymlink {
		return fmt.Errorf("%w: fuse cannot be used with mount_mode symlink (targets are bind mounts of the FUSE staging)", ErrInvalidConfig)
	}
	if c.FUSEFailDeadUnmount && !c.FUSE {
		return fmt.Errorf("%w: fuse_fail_dead_unmount needs fuse", ErrInvalidConfig)
	}
	switch c.MountMode {
	case "", MountModeAuto, MountModeBind, MountModeSymlink:
	default:
		return fmt.Errorf("%w: mount_mode %q: want auto, bind or symlink", ErrInvalidConfig, c.MountMode)
	}
	return nil
}

// RegisterFlags defines flags for c's fields on fs, with c's current values
// as defaults: -endpoint, -state-dir, -node-id, -name,
// -max-volumes-per-node, -zone, -capacity, -mount-mode, -lose-mounts-on-start,
// -no-volume-stats, -fuse, -fuse-fail-dead-unmount, -shared-dir and
// -accepted-mutable-parameter-names. The logger is left to
// the caller.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "endpoint", c.Endpoint, "unix socket to serve: unix:///path or a path")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory for the volumes and the state file")
	fs.StringVar(&c.SharedDir, "shared-dir", c.SharedDir, "directory for the volumes and the state, shared with the other instances given it (default: none, all in -state-dir)")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "node id to report (default: the hostname)")
	fs.StringVar(&c.Name, "name", c.Name, "plugin name to report")
	fs.Int64Var(&c.MaxAttached, "max-attached", c.MaxAttached, "volumes the storage lets be controller-published at once, not reported to the CO (0: no limit)")
	fs.Int64Var(&c.MaxVolumesPerNode, "max-volumes-per-node", c.MaxVolumesPerNode, "volumes that may be published to the node at once (0: no limit)")
	fs.StringVar(&c.Zone, "zone", c.Zone, "zone of the node and of every volume it creates (topology key "+TopologyKeyZone+"; default: no topology)")
	fs.Int64Var(&c.Capacity, "capacity", c.Capacity, "bytes GetCapacity shares out among the volumes (0: the free space under -state-dir)")
	fs.BoolVar(&c.LoseMountsOnStart, "lose-mounts-on-start", c.LoseMountsOnStart, "on start, undo every recorded staging and publication, keeping the records (as FUSE mounts die with their plugin; for tests)")
	fs.BoolVar(&c.NoVolumeStats, "no-volume-stats", c.NoVolumeStats, "report neither a volume's usage nor its condition: no GET_VOLUME_STATS and no GET_VOLUME_HEALTH (for tests)")
	fs.BoolVar(&c.FUSE, "fuse", c.FUSE, "stage each volume through FUSE served by this process, so that its mounts die with it (needs root and /dev/fuse)")
	fs.BoolVar(&c.FUSEFailDeadUnmount, "fuse-fail-dead-unmount", c.FUSEFailDeadUnmount, "with -fuse: fail NodeUnpublishVolume and NodeUnstageVolume (Internal) on a dead FUSE mount instead of unmounting it (for tests)")
	fs.Func("accepted-mutable-parameter-names", "comma-separated mutable parameter `names` CreateVolume and ControllerModifyVolume accept (default "+strings.Join(DefaultAcceptedMutableParameters, ",")+")", func(s string) error {
		c.AcceptedMutableParameters = nil
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.AcceptedMutableParameters = append(c.AcceptedMutableParameters, n)
			}
		}
		if len(c.AcceptedMutableParameters) == 0 {
			return fmt.Errorf("want at least one name")
		}
		return nil
	})
	fs.Func("mount-mode", "auto, bind or symlink (default auto: bind as root, symlink otherwise)", func(s string) error {
		m := MountMode(s)
		switch m {
		case MountModeAuto, MountModeBind, MountModeSymlink:
			c.MountMode = m
			return nil
		}
		return fmt.Errorf("want auto, bind or symlink")
	})
}

// ParseEndpoint returns the socket path of a "unix:///path" endpoint or of
// a bare path. Other schemes, an empty path and paths longer than the
// 107-byte unix socket limit are rejected with ErrInvalidConfig.
func ParseEndpoint(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("%w: endpoint %q: only unix sockets are supported", ErrInvalidConfig, endpoint)
	}
	if p == "" {
		return "", fmt.Errorf("%w: endpoint %q has no socket path", ErrInvalidConfig, endpoint)
	}
	p = filepath.Clean(p)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("%w: endpoint socket path is %d bytes, unix limit is %d", ErrInvalidConfig, len(p), maxSocketPath)
	}
	return p, nil
}
