package persistence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/csiactor/csiactor/internal/seal"
)

// Secrets at rest. With Config.Keyring set, the store seals the value of
// every secret it writes (Volume.Secrets, Snapshot.Secrets) on its own,
// with the record and the secret's name as additional data (see package
// seal), and opens them on every read: callers only ever see secrets in
// clear. A binary volume record with sealed secrets starts with
// volumeFormatBinarySealed; a JSON record (snapshots, and volumes when the
// codec does not cover the record types) keeps them under
// "sealed_secrets" instead of "secrets". Records written in clear (before
// a key was set) are read as they are and sealed at their next write, or
// by Reseal.

// volumeRecord and snapshotRecord name a record for sealing: a value
// sealed for one never opens for another.
func volumeRecord(id string) string   { return "volume/" + id }
func snapshotRecord(id string) string { return "snapshot/" + id }

// volumeJSON is a volume's JSON form with sealed secrets.
type volumeJSON struct {
	*Volume
	SealedSecrets map[string]string `json:"sealed_secrets,omitempty"`
}

// snapshotJSON is a snapshot's JSON form with sealed secrets.
type snapshotJSON struct {
	*Snapshot
	SealedSecrets map[string]string `json:"sealed_secrets,omitempty"`
}

// decodeErr wraps a failure to decode the stored kind id: a secret that
// does not open keeps the seal package's error (which names the key ID,
// never the value), anything else is ErrCorrupt.
func (s *Store) decodeErr(kind, id string, err error) error {
	if errors.Is(err, seal.ErrUnknownKey) || errors.Is(err, seal.ErrOpen) {
		return fmt.Errorf("store %s: %s %q: %w", s.path, kind, id, err)
	}
	return fmt.Errorf("store %s: decode %s %q: %w: %w", s.path, kind, id, ErrCorrupt, err)
}

// encodeSnapshot encodes sn as stored, its secrets sealed when the store
// has a keyring.
func (s *Store) encodeSnapshot(sn *Snapshot) ([]byte, error) {
	var rec any = sn
	if s.cfg.Keyring.Enabled() && len(sn.Secrets) > 0 {
		cp := *sn
		cp.Secrets = nil
		rec = snapshotJSON{Snapshot: &cp, SealedSecrets: s.cfg.Keyring.SealMap(snapshotRecord(sn.ID), sn.Secrets)}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %q: %w", sn.ID, err)
	}
	return data, nil
}

// decodeSnapshotRaw decodes a stored snapshot; sealed reports that
// sn.Secrets holds sealed values.
func decodeSnapshotRaw(data []byte, sn *Snapshot) (sealed bool, err error) {
	*sn = Snapshot{}
	w := snapshotJSON{Snapshot: sn}
	if err := json.Unmarshal(data, &w); err != nil {
		return false, err
	}
	if w.SealedSecrets != nil {
		sn.Secrets = w.SealedSecrets
		return true, nil
	}
	return false, nil
}

// decodeSnapshot decodes a stored snapshot and opens its secrets.
func (s *Store) decodeSnapshot(id string, data []byte, sn *Snapshot) error {
	sealed, err := decodeSnapshotRaw(data, sn)
	if err == nil && sealed {
		sn.Secrets, err = s.cfg.Keyring.OpenMap(snapshotRecord(sn.ID), sn.Secrets)
	}
	if err != nil {
		return s.decodeErr("snapshot", id, err)
	}
	return nil
}

// resealChunk is how many records one transaction of Reseal looks at.
const resealChunk = 256

// Reseal rewrites with Config.Keyring's current key every stored secret it
// did not seal: those sealed with a previous key, and those written in
// clear before a key was set. It returns how many secret values it
// rewrote. After it, the previous keys can be dropped.
//
// It checkpoints the journal first, then rewrites the store file a chunk
// of records per transaction, each record read and written in the same
// transaction, so a write that returned before or during it is never
// undone (one still in the journal is sealed with the current key already
// and reaches the file later). A secret sealed with a key the keyring
// lacks fails it, naming the record and the key ID.
func (s *Store) Reseal(ctx context.Context) (int, error) {
	if !s.cfg.Keyring.Enabled() {
		return 0, fmt.Errorf("reseal: the store has no keyring: %w", ErrInvalidConfig)
	}
	if err := s.checkpointForScan(ctx); err != nil {
		return 0, err
	}
	total := 0
	for _, b := range []struct {
		bucket string
		reseal func(data []byte) ([]byte, int, error)
	}{{bucketVolumes, s.resealVolume}, {bucketSnapshots, s.resealSnapshot}} {
		var after []byte // last key seen, copied out of its transaction
		for {
			var n, seen int
			var last []byte
			// apply may run more than once: it sets n, seen and last anew.
			err := s.write(ctx, func(tx *bolt.Tx) error {
				n, seen, last = 0, 0, nil
				bk := tx.Bucket([]byte(b.bucket))
				c := bk.Cursor()
				var k, data []byte
				if after == nil {
					k, data = c.First()
				} else if k, data = c.Seek(after); k != nil && bytes.Equal(k, after) {
					k, data = c.Next()
				}
				var keys, values [][]byte
				for ; k != nil && seen < resealChunk; k, data = c.Next() {
					seen++
					last = k
					out, stale, err := b.reseal(data)
					if err != nil {
						return s.decodeErr(b.bucket[:len(b.bucket)-1], string(k), err)
					}
					if stale > 0 {
						keys, values = append(keys, bytes.Clone(k)), append(values, out)
						n += stale
					}
				}
				last = bytes.Clone(last)
				// Put after the walk: a put moves the cursor's pages.
				for i := range keys {
					if err := bk.Put(keys[i], values[i]); err != nil {
						return fmt.Errorf("reseal %s %q: %w", b.bucket, keys[i], err)
					}
				}
				return nil
			})
			if err != nil {
				return total, err
			}
			total += n
			if seen < resealChunk {
				break
			}
			after = last
		}
	}
	return total, nil
}

// resealVolume returns data, a stored volume, sealed with the current
// key, and how many of its secrets were not; nothing when none.
func (s *Store) resealVolume(data []byte) ([]byte, int, error) {
	var v Volume
	sealed, err := decodeVolumeRaw(data, &v)
	var stale int
	if err == nil {
		v.Secrets, stale, err = s.staleSecrets(volumeRecord(v.ID), v.Secrets, sealed)
	}
	if err != nil || stale == 0 {
		return nil, 0, err
	}
	out, err := s.encodeVolume(&v)
	return out, stale, err
}

// resealSnapshot is resealVolume for a stored snapshot.
func (s *Store) resealSnapshot(data []byte) ([]byte, int, error) {
	var sn Snapshot
	sealed, err := decodeSnapshotRaw(data, &sn)
	var stale int
	if err == nil {
		sn.Secrets, stale, err = s.staleSecrets(snapshotRecord(sn.ID), sn.Secrets, sealed)
	}
	if err != nil || stale == 0 {
		return nil, 0, err
	}
	out, err := s.encodeSnapshot(&sn)
	return out, stale, err
}

// staleSecrets counts the secrets of record, as stored (sealed or not),
// that the current key did not seal, and returns them opened when any.
func (s *Store) staleSecrets(record string, secrets map[string]string, sealed bool) (map[string]string, int, error) {
	if !sealed {
		return secrets, len(secrets), nil
	}
	stale := s.cfg.Keyring.Stale(secrets)
	if stale == 0 {
		return nil, 0, nil
	}
	open, err := s.cfg.Keyring.OpenMap(record, secrets)
	return open, stale, err
}
