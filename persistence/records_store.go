package persistence

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// checkID rejects an ID bbolt cannot use as a key.
func checkID(field, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%s is empty: %w", field, ErrInvalid)
	case len(id) > bolt.MaxKeySize:
		return fmt.Errorf("%s is %d bytes, longer than %d: %w", field, len(id), bolt.MaxKeySize, ErrInvalid)
	}
	return nil
}

// decode unmarshals a stored value. json.Unmarshal copies what it keeps,
// so nothing of data (which belongs to the transaction) outlives it.
func (s *Store) decode(kind, id string, data []byte, into any) error {
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("store %s: decode %s %q: %w: %w", s.path, kind, id, ErrCorrupt, err)
	}
	return nil
}

// PutAllocation stores a, replacing any record with the same ID, and
// returns the record as stored. The first time an ID is stored it gets the
// next value of a persisted counter as its Seq; later puts of the same ID
// keep that Seq whatever a.Seq says. An ID that was deleted and is put
// again counts as new and gets a new, larger Seq. Nothing else is changed.
func (s *Store) PutAllocation(ctx context.Context, a Allocation) (Allocation, error) {
	if err := checkID("allocation id", a.ID); err != nil {
		return Allocation{}, err
	}
	a.Command = slices.Clone(a.Command)
	a.Env = maps.Clone(a.Env)
	a.Image = a.Image.Clone()
	key := []byte(a.ID)
	var stored Allocation
	err := s.write(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketAllocations))
		rec := a
		if old := b.Get(key); old != nil {
			var prev struct {
				Seq uint64 `json:"seq"`
			}
			if err := s.decode("allocation", a.ID, old, &prev); err != nil {
				return err
			}
			rec.Seq = prev.Seq
		} else {
			seq, err := b.NextSequence()
			if err != nil {
				return fmt.Errorf("next allocation seq: %w", err)
			}
			rec.Seq = seq
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode allocation %q: %w", a.ID, err)
		}
		if err := b.Put(key, data); err != nil {
			return fmt.Errorf("put allocation %q: %w", a.ID, err)
		}
		stored = rec
		return nil
	})
	if err != nil {
		return Allocation{}, err
	}
	return stored, nil
}

// DeleteAllocation removes the allocation with id. Deleting an unknown ID
// is not an error (deregistration is idempotent).
func (s *Store) DeleteAllocation(ctx context.Context, id string) error {
	if err := checkID("allocation id", id); err != nil {
		return err
	}
	key := []byte(id)
	return s.write(ctx, func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(bucketAllocations)).Delete(key); err != nil {
			return fmt.Errorf("delete allocation %q: %w", id, err)
		}
		return nil
	})
}

// Allocation returns the allocation with id, or an error wrapping
// ErrNotFound.
func (s *Store) Allocation(ctx context.Context, id string) (Allocation, error) {
	if err := checkID("allocation id", id); err != nil {
		return Allocation{}, err
	}
	var a Allocation
	err := s.view(ctx, func(tx *bolt.Tx) error {
		data := tx.Bucket([]byte(bucketAllocations)).Get([]byte(id))
		if data == nil {
			return fmt.Errorf("allocation %q: %w", id, ErrNotFound)
		}
		return s.decode("allocation", id, data, &a)
	})
	if err != nil {
		return Allocation{}, err
	}
	return a, nil
}

// Allocations returns every allocation, oldest (lowest Seq) first.
func (s *Store) Allocations(ctx context.Context) ([]Allocation, error) {
	var out []Allocation
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketAllocations)).ForEach(func(k, v []byte) error {
			var a Allocation
			if err := s.decode("allocation", string(k), v, &a); err != nil {
				return err
			}
			out = append(out, a)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// MaxBootIDLen bounds a boot ID PutBootID accepts (a Linux boot ID is a
// 36-byte UUID).
const MaxBootIDLen = 256

// BootID returns the host's boot ID as last recorded by PutBootID, or ""
// when none was. The agent compares it with the running host's to know
// whether the host rebooted since the last run (every mount is then gone).
func (s *Store) BootID(ctx context.Context) (string, error) {
	var id string
	err := s.view(ctx, func(tx *bolt.Tx) error {
		id = string(tx.Bucket([]byte(bucketMeta)).Get([]byte(keyBootID)))
		return nil
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// PutBootID records the host's boot ID. An empty ID, one longer than
// MaxBootIDLen or one with a control character or space is ErrInvalid.
func (s *Store) PutBootID(ctx context.Context, id string) error {
	if id == "" || len(id) > MaxBootIDLen {
		return fmt.Errorf("boot id is %d bytes (want 1 to %d): %w", len(id), MaxBootIDLen, ErrInvalid)
	}
	for _, r := range id {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("boot id contains a space or control character: %w", ErrInvalid)
		}
	}
	return s.write(ctx, func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(bucketMeta)).Put([]byte(keyBootID), []byte(id)); err != nil {
			return fmt.Errorf("put boot id: %w", err)
		}
		return nil
	})
}
