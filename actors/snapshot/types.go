package snapshot

import (
	"fmt"
	"maps"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// Snapshot states, as Snapshot.State shows them.
const (
	StateCreating = persistence.SnapshotCreating
	StateReady    = persistence.SnapshotReady
	StateDeleting = persistence.SnapshotDeleting
)

// Spec is a snapshot to take: CreateSnapshot named ID of the registered
// volume SourceVolume, through Plugin's controller.
type Spec struct {
	ID           string
	Plugin       string
	SourceVolume string
	Parameters   map[string]string
	Secrets      map[string]string
}

func (s Spec) validate() error {
	if err := claim.CheckName("id", s.ID); err != nil {
		return err
	}
	if err := claim.CheckName("plugin", s.Plugin); err != nil {
		return err
	}
	return claim.CheckName("source_volume", s.SourceVolume)
}

// sameAs reports whether s is the definition rec was recorded with.
func (s Spec) sameAs(rec *persistence.Snapshot) bool {
	return s.Plugin == rec.Plugin && s.SourceVolume == rec.SourceVolume &&
		maps.Equal(s.Parameters, rec.Parameters) && maps.Equal(s.Secrets, rec.Secrets)
}

// Snapshot is a snapshot as the manager shows it. It never holds secrets.
type Snapshot struct {
	ID     string
	Plugin string
	// SourceVolume is the volume it was taken of (its ID here), and
	// SourceExternalID the plugin's ID of that volume.
	SourceVolume     string
	SourceExternalID string
	Parameters       map[string]string
	// ExternalID is the plugin's ID of the snapshot; "" until
	// CreateSnapshot answered.
	ExternalID   string
	SizeBytes    int64
	CreationTime time.Time
	ReadyToUse   bool
	// State is StateCreating, StateReady or StateDeleting.
	State string
	// LastError and Attempts describe the failures of the step that runs.
	LastError string
	Attempts  int
	// Restoring is how many volumes are being restored from it now.
	Restoring int
	CreatedAt time.Time
	UpdatedAt time.Time
}

func viewOf(rec *persistence.Snapshot, restoring int) Snapshot {
	return Snapshot{
		ID: rec.ID, Plugin: rec.Plugin, SourceVolume: rec.SourceVolume, SourceExternalID: rec.SourceExternalID,
		Parameters: maps.Clone(rec.Parameters), ExternalID: rec.ExternalID, SizeBytes: rec.SizeBytes,
		CreationTime: rec.CreationTime, ReadyToUse: rec.ReadyToUse, State: rec.State,
		LastError: rec.LastError, Attempts: rec.Attempts, Restoring: restoring,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
	}
}

// Filter selects snapshots in List; empty fields match every snapshot.
type Filter struct {
	Plugin string
	// Volume is a source volume's ID.
	Volume string
}

func (f Filter) match(rec *persistence.Snapshot) bool {
	return (f.Plugin == "" || f.Plugin == rec.Plugin) && (f.Volume == "" || f.Volume == rec.SourceVolume)
}

// Event types the manager reports through Config.OnEvent. The strings are
// the ones the agent's event stream uses.
const (
	// EventSnapshotCreating: the snapshot is recorded and CreateSnapshot
	// starts; EventSnapshotCreated: the plugin has it, ready to use;
	// EventSnapshotCreateFailed: the plugin refused it for good and the
	// record is gone.
	EventSnapshotCreating     = "snapshot-creating"
	EventSnapshotCreated      = "snapshot-created"
	EventSnapshotCreateFailed = "snapshot-create-failed"
	// EventSnapshotDeleted: DeleteSnapshot succeeded (or the plugin no
	// longer had it) and the record is gone; EventSnapshotDeleteFailed:
	// the plugin refused it for good and the snapshot stays ready.
	EventSnapshotDeleted      = "snapshot-deleted"
	EventSnapshotDeleteFailed = "snapshot-delete-failed"
)

// Event is something that happened to a snapshot, reported after it was
// persisted. Message never holds secrets.
type Event struct {
	Time     time.Time
	Type     string
	Plugin   string
	Snapshot string
	// Volume is the snapshot's source volume.
	Volume  string
	Message string
}

func (m *Manager) emit(rec *persistence.Snapshot, typ, format string, args ...any) {
	if m.cfg.OnEvent == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: typ, Plugin: rec.Plugin, Snapshot: rec.ID, Volume: rec.SourceVolume,
		Message: fmt.Sprintf(format, args...)})
}
