package csiplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// stateVersion is the schema version of state.json.
const stateVersion = 1

const (
	stateFile  = "state.json"
	lockFile   = "lock"
	volumesDir = "volumes"
	volumeIDPf = "vol-"
)

// volumeIDRE matches the ids this plugin hands out. Any other id is
// unknown, and is never turned into a path.
var volumeIDRE = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)

// volumeIDFor derives a volume id from a CreateVolume name, so that a
// retried CreateVolume lands on the same directory even if the plugin died
// before it recorded the volume.
func volumeIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return volumeIDPf + hex.EncodeToString(sum[:16])
}

// state is everything the plugin knows, as saved in state.json.
type state struct {
	Version   int                  `json:"version"`
	Volumes   map[string]*volume   `json:"volumes"`
	Snapshots map[string]*snapshot `json:"snapshots,omitempty"`
	// Nodes are the node ids of the instances that share this state (see
	// Config.SharedDir); empty for an instance's own state.
	Nodes []string `json:"nodes,omitempty"`
}

// volume is one volume: a directory under StateDir/volumes, what the
// controller published and where the node staged and published it.
type volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacity_bytes"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	// MutableParameters are what CreateVolume and ControllerModifyVolume
	// set, merged.
	MutableParameters map[string]string `json:"mutable_parameters,omitempty"`
	// Zone is the zone the volume was created in (Config.Zone); "" when
	// the plugin had none.
	Zone string `json:"zone,omitempty"`
	// Source is where the volume's first content was copied from; nil
	// for a volume created empty.
	Source *contentSource `json:"source,omitempty"`
	// Published maps a node id to its controller publication.
	Published map[string]controllerPublication `json:"published,omitempty"`
	// Staged maps a staging path to how it was staged.
	Staged map[string]attachment `json:"staged,omitempty"`
	// Targets maps a target path to how it was published.
	Targets map[string]attachment `json:"targets,omitempty"`
}

// controllerPublication is one ControllerPublishVolume.
type controllerPublication struct {
	AccessMode csipb.VolumeCapability_AccessMode_Mode `json:"access_mode"`
	Readonly   bool                                   `json:"readonly"`
}

// attachment is one NodeStageVolume or NodePublishVolume. MountFlags holds
// the MS_* bits of the accepted mount flags, never the flag strings.
type attachment struct {
	AccessMode  csipb.VolumeCapability_AccessMode_Mode `json:"access_mode"`
	MountFlags  uintptr                                `json:"mount_flags,omitempty"`
	Readonly    bool                                   `json:"readonly,omitempty"`
	StagingPath string                                 `json:"staging_path,omitempty"`
}

// inUse reports whether anything still holds the volume.
func (v *volume) inUse() bool {
	return len(v.Published) > 0 || len(v.Staged) > 0 || len(v.Targets) > 0
}

func (v *volume) csi() *csipb.Volume {
	out := &csipb.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, ContentSource: v.Source.csi()}
	if v.Zone != "" {
		out.AccessibleTopology = []*csipb.Topology{{Segments: map[string]string{TopologyKeyZone: v.Zone}}}
	}
	return out
}

// sortedIDs returns the volume ids in order, for ListVolumes paging.
func (s *state) sortedIDs() []string {
	ids := make([]string, 0, len(s.Volumes))
	for id := range s.Volumes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// emptyState is the state of a plugin that knows nothing yet.
func emptyState() *state {
	return &state{Version: stateVersion, Volumes: map[string]*volume{}, Snapshots: map[string]*snapshot{}}
}

// loadState reads dir/state.json; a missing file is an empty state.
func loadState(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return emptyState(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorruptState, filepath.Join(dir, stateFile), err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("%w: %s: schema version %d, want %d", ErrCorruptState, filepath.Join(dir, stateFile), s.Version, stateVersion)
	}
	if s.Volumes == nil {
		s.Volumes = map[string]*volume{}
	}
	for id, v := range s.Volumes {
		if v == nil || v.ID != id || !volumeIDRE.MatchString(id) {
			return nil, fmt.Errorf("%w: %s: bad volume entry %q", ErrCorruptState, filepath.Join(dir, stateFile), id)
		}
	}
	if s.Snapshots == nil {
		s.Snapshots = map[string]*snapshot{}
	}
	for id, sn := range s.Snapshots {
		if sn == nil || sn.ID != id || !snapshotIDRE.MatchString(id) {
			return nil, fmt.Errorf("%w: %s: bad snapshot entry %q", ErrCorruptState, filepath.Join(dir, stateFile), id)
		}
	}
	return &s, nil
}

// save writes the state to dir/state.json atomically: a synced temporary
// file renamed over the old one, then the directory synced.
func (s *state) save(dir string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp, err := os.CreateTemp(dir, stateFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("save state: sync dir: %w", err)
	}
	return nil
}

// lockStateDir takes an exclusive, non-blocking flock on dir/lock. The
// kernel drops it when the process dies, so a crashed plugin never leaves
// a stale lock.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrStateDirLocked, dir)
		}
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	return f, nil
}
