package persistence

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"

	bolt "go.etcd.io/bbolt"

	"github.com/csiactor/csiactor/internal/seal"
)

// forEachChunk is how many volumes ForEachVolume decodes per read
// transaction.
const forEachChunk = 256

// Active reports whether v has anything the agent must track or finish
// after a restart: a claim, a past claim, a staging that is staged or has
// users, a controller publish, an expansion or modification in progress,
// or an ephemeral volume being created or deleted. ActiveVolumes returns
// exactly the stored volumes for which it is true.
func (v *Volume) Active() bool {
	if len(v.Claims) > 0 || len(v.PastClaims) > 0 || v.ControllerPublished || v.Expansion != nil || len(v.Modifying) > 0 ||
		v.Ephemeral == EphemeralCreating || v.Ephemeral == EphemeralDeleting {
		return true
	}
	for _, st := range v.Stagings {
		if st.Staged || len(st.Users) > 0 {
			return true
		}
	}
	return false
}

// PutVolume stores v whole, replacing any record with the same ID, and
// keeps the index of active volumes (see Volume.Active) with it. It
// changes nothing in v: Revision, UpdatedAt and the rest are the caller's
// (the volume actor's) to set.
//
// The write is appended to the journal and returns when it is there (with
// Config.NoSync, when it is written; otherwise when it is synced); every
// read sees it from then on. A checkpoint moves it into the store file
// later, the record and its index entry in one transaction.
func (s *Store) PutVolume(ctx context.Context, v Volume) error {
	if err := checkID("volume id", v.ID); err != nil {
		return err
	}
	// Encode before queueing: the commit is the one serial part of every
	// write, so it only copies bytes.
	data, err := s.encodeVolume(&v)
	if err != nil {
		return err
	}
	if s.directVolumes {
		id, key, active := v.ID, []byte(v.ID), v.Active()
		return s.write(ctx, func(tx *bolt.Tx) error { return putVolumeTx(tx, id, key, data, active) })
	}
	return s.journalWrite(ctx, journalOpPut, v.ID, data, v.Active())
}

// PutVolumes stores every volume of vs as PutVolume does, all of them or
// none: one journal append (one group, which replay applies whole or not
// at all, and with sync on one fdatasync), or with the journal off one
// bbolt transaction. It is the store's side of a bulk registration. An
// invalid ID or a volume too large to encode fails the whole call, naming
// it, before anything is written. Two volumes with one ID is ErrInvalid.
func (s *Store) PutVolumes(ctx context.Context, vs []Volume) error {
	if len(vs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	puts := make([]journalPut, len(vs))
	seen := make(map[string]struct{}, len(vs))
	for i := range vs {
		v := &vs[i]
		if err := checkID("volume id", v.ID); err != nil {
			return err
		}
		if _, dup := seen[v.ID]; dup {
			return fmt.Errorf("volume %q given twice: %w", v.ID, ErrInvalid)
		}
		seen[v.ID] = struct{}{}
		data, err := s.encodeVolume(v)
		if err != nil {
			return err
		}
		if n := journalBodyFixed + len(v.ID) + len(data); n > journalMaxBody {
			return fmt.Errorf("volume %q is %d bytes encoded, more than %d: %w", v.ID, n, journalMaxBody, ErrInvalid)
		}
		puts[i] = journalPut{id: v.ID, value: data, active: v.Active()}
	}
	if s.directVolumes {
		return s.write(ctx, func(tx *bolt.Tx) error {
			for _, p := range puts {
				if err := putVolumeTx(tx, p.id, []byte(p.id), p.value, p.active); err != nil {
					return err
				}
			}
			return nil
		})
	}
	r := &journalReq{replySlot: replySlot{done: make(chan error, 1)}, ctx: ctx, op: journalOpPut, puts: puts}
	return s.j.appends.submit(ctx, s, r)
}

// PutVolumeDeferred is PutVolume for a write that may be lost in a crash:
// one that only records a step in between two that are durable. It returns
// once the write is in memory, without waiting for the disk; every read
// sees it from then on. The next checkpoint, at most
// Config.CheckpointDelay later (or Close), moves it into the store file
// durably; a crash before that loses it, and Open finds the volume's last
// write that was durable.
//
// The volume actor defers the steps of a claim between its durable intent
// and its durable outcome: every CSI call is idempotent, so resuming from
// the last durable step only sends the lost steps' calls again.
//
// Writes of one volume must not overlap: a PutVolumeDeferred started
// while a PutVolume of the same volume has not returned may be replaced
// by the older write.
func (s *Store) PutVolumeDeferred(ctx context.Context, v Volume) error {
	if err := checkID("volume id", v.ID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := s.encodeVolume(&v)
	if err != nil {
		return err
	}
	if s.directVolumes {
		return s.PutVolume(ctx, v)
	}
	return s.deferWrite(v.ID, data, v.Active())
}

// DeleteVolume removes the volume with id. Deleting an unknown ID is not an
// error. The store does not check for claims: refusing to deregister a
// claimed volume is the volume actor's decision. Like PutVolume, it is
// journaled.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	if err := checkID("volume id", id); err != nil {
		return err
	}
	if s.directVolumes {
		key := []byte(id)
		return s.write(ctx, func(tx *bolt.Tx) error { return deleteVolumeTx(tx, id, key) })
	}
	return s.journalWrite(ctx, journalOpDelete, id, nil, false)
}

// Volume returns the volume with id, or an error wrapping ErrNotFound.
func (s *Store) Volume(ctx context.Context, id string) (Volume, error) {
	if err := checkID("volume id", id); err != nil {
		return Volume{}, err
	}
	var v Volume
	if e, ok := s.j.lookup(id); ok {
		switch {
		case ctx.Err() != nil:
			return Volume{}, ctx.Err()
		case s.isClosed():
			return Volume{}, ErrClosed
		case e.value == nil:
			return Volume{}, fmt.Errorf("volume %q: %w", id, ErrNotFound)
		}
		if err := s.decodeVolume(id, e.value, &v); err != nil {
			return Volume{}, err
		}
		return v, nil
	}
	// Not journaled since the last checkpoint: the store file has its
	// latest write. (An overlay is dropped only after its checkpoint has
	// committed.)
	err := s.view(ctx, func(tx *bolt.Tx) error {
		data := tx.Bucket([]byte(bucketVolumes)).Get([]byte(id))
		if data == nil {
			return fmt.Errorf("volume %q: %w", id, ErrNotFound)
		}
		return s.decodeVolume(id, data, &v)
	})
	if err != nil {
		return Volume{}, err
	}
	return v, nil
}

// checkpointForScan moves every journaled write into the store file, so
// that a scan of the file sees every write that returned before it.
func (s *Store) checkpointForScan(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	if !s.j.pending() {
		return nil
	}
	return s.checkpoint()
}

// ForEachVolume calls fn for every stored volume in ID order and stops at
// the first error fn returns, which it returns unchanged.
//
// It first checkpoints the journal, so it sees every write that returned
// before it was called. Volumes are read in chunks, each in its own read
// transaction, and fn runs outside any transaction: fn may call the Store
// (even write), and a long walk does not hold up the committer. Each
// volume is one consistent record, but the walk is not one snapshot: a
// volume put or deleted during the walk may or may not be seen.
func (s *Store) ForEachVolume(ctx context.Context, fn func(Volume) error) error {
	return s.ForEachVolumeFrom(ctx, "", fn)
}

// ForEachVolumeFrom is ForEachVolume from the first volume whose ID is
// from or sorts after it: a page of a listing.
func (s *Store) ForEachVolumeFrom(ctx context.Context, from string, fn func(Volume) error) error {
	if err := s.checkpointForScan(ctx); err != nil {
		return err
	}
	var after []byte // last key seen, copied out of its transaction
	chunk := make([]Volume, 0, forEachChunk)
	for {
		chunk = chunk[:0]
		err := s.view(ctx, func(tx *bolt.Tx) error {
			c := tx.Bucket([]byte(bucketVolumes)).Cursor()
			var k, data []byte
			if after == nil {
				k, data = c.Seek([]byte(from))
			} else if k, data = c.Seek(after); k != nil && bytes.Equal(k, after) {
				k, data = c.Next()
			}
			for ; k != nil && len(chunk) < forEachChunk; k, data = c.Next() {
				var v Volume
				if err := s.decodeVolume(string(k), data, &v); err != nil {
					return err
				}
				chunk = append(chunk, v)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, v := range chunk {
			if err := fn(v); err != nil {
				return err
			}
		}
		if len(chunk) < forEachChunk {
			return nil
		}
		after = []byte(chunk[len(chunk)-1].ID)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// VolumeIDs returns the IDs of every stored volume, sorted, without
// decoding the records. It checkpoints the journal first.
func (s *Store) VolumeIDs(ctx context.Context) ([]string, error) {
	if err := s.checkpointForScan(ctx); err != nil {
		return nil, err
	}
	var ids []string
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumes)).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// ActiveVolumes returns every stored volume for which Volume.Active is
// true, in ID order, in one snapshot of the store file taken after it has
// checkpointed the journal: the volumes an agent must hand to volume
// actors at start-up. It reads them through an index kept with each
// record, so idle volumes cost nothing, and decodes them on all CPUs.
func (s *Store) ActiveVolumes(ctx context.Context) ([]Volume, error) {
	if err := s.checkpointForScan(ctx); err != nil {
		return nil, err
	}
	var out []Volume
	err := s.view(ctx, func(tx *bolt.Tx) error {
		vols := tx.Bucket([]byte(bucketVolumes)).Cursor()
		idx := tx.Bucket([]byte(bucketVolumesWithWork)).Cursor()
		// Both buckets are sorted by ID: walk the volumes cursor forward
		// next to the index, seeking only across gaps of idle volumes.
		// raw values point into the transaction's pages; they are decoded
		// (copied) before the transaction ends.
		var raw [][]byte
		var vk, data []byte
		for k, _ := idx.First(); k != nil; k, _ = idx.Next() {
			if vk != nil {
				vk, data = vols.Next()
			}
			if vk == nil || !bytes.Equal(vk, k) {
				vk, data = vols.Seek(k)
			}
			if vk == nil || !bytes.Equal(vk, k) {
				// Written in one transaction with the record, so this is
				// damage; the record is gone either way.
				s.log.WithField("volume", string(k)).Warn("active-volume index names a volume that is not stored; skipping it")
				continue
			}
			raw = append(raw, data)
		}
		out = make([]Volume, len(raw))
		return s.decodeVolumes(ctx, raw, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// decodeVolumes decodes raw[i] into out[i] on up to GOMAXPROCS goroutines
// and returns the first error. It returns only when all of them are done.
func (s *Store) decodeVolumes(ctx context.Context, raw [][]byte, out []Volume) error {
	const minPerWorker = 512
	workers := min(runtime.GOMAXPROCS(0), (len(raw)+minPerWorker-1)/minPerWorker)
	if workers <= 1 {
		return s.decodeVolumeRange(ctx, raw, out)
	}
	errs := make(chan error, workers)
	per := (len(raw) + workers - 1) / workers
	for lo := 0; lo < len(raw); lo += per {
		hi := min(len(raw), lo+per)
		go func() {
			// Each goroutine reads mapped pages: guard it like any reader.
			errs <- guard(s.path, func() error { return s.decodeVolumeRange(ctx, raw[lo:hi], out[lo:hi]) })
		}()
	}
	var first error
	for lo := 0; lo < len(raw); lo += per {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *Store) decodeVolumeRange(ctx context.Context, raw [][]byte, out []Volume) error {
	for i, data := range raw {
		if err := decodeVolumeValue(data, &out[i], s.cfg.Keyring); err != nil {
			id := out[i].ID
			if id == "" {
				id = fmt.Sprintf("#%d of the active set", i)
			}
			return s.decodeErr("volume", id, err)
		}
		if i%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// minEncodeCap is the least buffer encodeVolume starts with.
const minEncodeCap = 256

// encodeVolume encodes v for storage: binary when the codec covers the
// record types as compiled, JSON otherwise (see codec.go), with its
// secrets sealed when the store has a keyring (see sealing.go).
func (s *Store) encodeVolume(v *Volume) ([]byte, error) {
	var sealed map[string]string
	if s.cfg.Keyring.Enabled() && len(v.Secrets) > 0 {
		sealed = s.cfg.Keyring.SealMap(volumeRecord(v.ID), v.Secrets)
		cp := *v
		cp.Secrets = sealed
		v = &cp
	}
	if s.binaryVolumes {
		data := appendVolume(make([]byte, 0, max(minEncodeCap, s.encodeCap.Load())), v)
		if sealed != nil {
			data[0] = volumeFormatBinarySealed
		}
		s.encodeCap.Store(int64(len(data) + len(data)/8))
		return data, nil
	}
	// A copy, so that only this rare branch puts a Volume on the heap
	// (json.Marshal makes its argument escape), not every caller's v.
	cp := *v
	var rec any = &cp
	if sealed != nil {
		cp.Secrets = nil
		rec = volumeJSON{Volume: &cp, SealedSecrets: sealed}
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode volume %q: %w", v.ID, err)
	}
	return data, nil
}

// decodeVolume decodes a stored volume value of either form into v,
// opening its sealed secrets; a failure wraps ErrCorrupt, or the seal
// package's error (see decodeErr).
func (s *Store) decodeVolume(id string, data []byte, v *Volume) error {
	if err := decodeVolumeValue(data, v, s.cfg.Keyring); err != nil {
		return s.decodeErr("volume", id, err)
	}
	return nil
}

// decodeVolumeValue decodes a binary or JSON volume value and opens its
// sealed secrets with keys. Neither keeps a reference to data.
func decodeVolumeValue(data []byte, v *Volume, keys *seal.Keyring) error {
	sealed, err := decodeVolumeRaw(data, v)
	if err != nil || !sealed {
		return err
	}
	v.Secrets, err = keys.OpenMap(volumeRecord(v.ID), v.Secrets)
	return err
}

// decodeVolumeRaw decodes a binary or JSON volume value as stored: sealed
// reports that v.Secrets holds sealed values.
func decodeVolumeRaw(data []byte, v *Volume) (sealed bool, err error) {
	if len(data) > 0 && (data[0] == volumeFormatBinary || data[0] == volumeFormatBinarySealed) {
		return data[0] == volumeFormatBinarySealed, decodeVolumeBinary(data, v)
	}
	*v = Volume{}
	w := volumeJSON{Volume: v}
	if err := json.Unmarshal(data, &w); err != nil {
		return false, err
	}
	if w.SealedSecrets != nil {
		v.Secrets = w.SealedSecrets
		return true, nil
	}
	return false, nil
}
