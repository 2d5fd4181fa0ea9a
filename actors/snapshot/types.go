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

// Snapshot is a snapshot as the manager and the agent's API show it: one
// taken through the agent (Registered), or one only the plugin lists
// (ListSnapshots; then ID is empty and only the plugin's fields are set).
// It never holds secrets: the type has no field for them.
type Snapshot struct {
	// ID is the snapshot's ID here; "" for one the plugin has and this
	// agent did not take.
	ID     string `json:"id,omitempty"`
	Plugin string `json:"plugin"`
	// SourceVolume is the ID here of the volume it was taken of, and
	// SourceExternalID the plugin's ID of that volume.
	SourceVolume     string            `json:"source_volume,omitempty"`
	SourceExternalID string            `json:"source_external_id,omitempty"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	// ExternalID is the plugin's ID of the snapshot; "" until
	// CreateSnapshot answered.
	ExternalID   string    `json:"external_id,omitempty"`
	SizeBytes    int64     `json:"size_bytes,omitempty"`
	CreationTime time.Time `json:"creation_time,omitzero"`
	ReadyToUse   bool      `json:"ready_to_use"`
	// State is StateCreating, StateReady or StateDeleting for a
	// registered snapshot, "" for one only the plugin lists.
	State string `json:"state,omitempty"`
	// LastError and Attempts describe the failures of the step that runs.
	LastError string `json:"last_error,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	// Restoring is how many volumes are being restored from it now.
	Restoring int `json:"restoring,omitempty"`
	// Registered says this agent took it (and knows it by ID): true for
	// every snapshot the manager returns.
	Registered bool      `json:"registered"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
}

// viewOf is the snapshot the record rec shows, restoring volumes being
// restored from it; it shares no map with rec.
func viewOf(rec *persistence.Snapshot, restoring int) Snapshot {
	return Snapshot{
		ID: rec.ID, Plugin: rec.Plugin, SourceVolume: rec.SourceVolume, SourceExternalID: rec.SourceExternalID,
		Parameters: maps.Clone(rec.Parameters), ExternalID: rec.ExternalID, SizeBytes: rec.SizeBytes,
		CreationTime: rec.CreationTime, ReadyToUse: rec.ReadyToUse, State: rec.State,
		LastError: rec.LastError, Attempts: rec.Attempts, Restoring: restoring, Registered: true,
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
