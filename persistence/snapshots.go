package persistence

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Snapshot states, as Snapshot.State holds them.
const (
	// SnapshotCreating: the snapshot is recorded and CreateSnapshot has
	// not answered ready yet; a restarted agent calls it again.
	SnapshotCreating = "creating"
	// SnapshotReady: CreateSnapshot answered with a snapshot ready to use.
	SnapshotReady = "ready"
	// SnapshotDeleting: DeleteSnapshot is under way; a restarted agent
	// calls it again, then deletes the record.
	SnapshotDeleting = "deleting"
)

// Snapshot is the persisted record of one snapshot taken through the
// agent. The snapshot actor owns it and writes it whole after each step.
type Snapshot struct {
	ID     string `json:"id"`
	Plugin string `json:"plugin"`
	// SourceVolume is the ID of the volume it was taken of, as registered
	// here; SourceExternalID is the plugin's ID of that volume.
	SourceVolume     string            `json:"source_volume"`
	SourceExternalID string            `json:"source_external_id"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	Secrets          map[string]string `json:"secrets,omitempty"`
	// ExternalID is the plugin's snapshot ID, once CreateSnapshot answered.
	ExternalID string `json:"external_id,omitempty"`
	SizeBytes  int64  `json:"size_bytes,omitempty"`
	// CreationTime is when the plugin says it cut the snapshot.
	CreationTime time.Time `json:"creation_time,omitzero"`
	ReadyToUse   bool      `json:"ready_to_use,omitempty"`
	// State is SnapshotCreating, SnapshotReady or SnapshotDeleting.
	State string `json:"state"`
	// LastError is the last failure of the current step, without secrets.
	LastError string `json:"last_error,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`

	// Revision increases by one on every write of the record.
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// migrate1to2 adds the snapshots bucket.
func migrate1to2(tx *bolt.Tx) error {
	if _, err := tx.CreateBucketIfNotExists([]byte(bucketSnapshots)); err != nil {
		return fmt.Errorf("create bucket %q: %w", bucketSnapshots, err)
	}
	return nil
}

// PutSnapshot stores sn whole, replacing any record with the same ID. It
// returns when the write is committed (synced unless Config.NoSync).
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	if err := checkID("snapshot id", sn.ID); err != nil {
		return err
	}
	data, err := s.encodeSnapshot(&sn)
	if err != nil {
		return err
	}
	key := []byte(sn.ID)
	return s.write(ctx, func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(bucketSnapshots)).Put(key, data); err != nil {
			return fmt.Errorf("put snapshot %q: %w", sn.ID, err)
		}
		return nil
	})
}

// DeleteSnapshot removes the snapshot record with id. Deleting an unknown
// ID is not an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkID("snapshot id", id); err != nil {
		return err
	}
	key := []byte(id)
	return s.write(ctx, func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(bucketSnapshots)).Delete(key); err != nil {
			return fmt.Errorf("delete snapshot %q: %w", id, err)
		}
		return nil
	})
}

// Snapshot returns the snapshot record with id, or an error wrapping
// ErrNotFound.
func (s *Store) Snapshot(ctx context.Context, id string) (Snapshot, error) {
	if err := checkID("snapshot id", id); err != nil {
		return Snapshot{}, err
	}
	var sn Snapshot
	err := s.view(ctx, func(tx *bolt.Tx) error {
		data := tx.Bucket([]byte(bucketSnapshots)).Get([]byte(id))
		if data == nil {
			return fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
		}
		return s.decodeSnapshot(id, data, &sn)
	})
	if err != nil {
		return Snapshot{}, err
	}
	return sn, nil
}

// Snapshots returns every snapshot record, in ID order.
func (s *Store) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out []Snapshot
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketSnapshots)).ForEach(func(k, v []byte) error {
			var sn Snapshot
			if err := s.decodeSnapshot(string(k), v, &sn); err != nil {
				return err
			}
			out = append(out, sn)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
