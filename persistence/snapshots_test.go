package persistence

import (
	"errors"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestStore_PutSnapshot_RoundTrip(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, Config{})
	now := time.Now().UTC().Truncate(time.Second)
	want := Snapshot{
		ID: "snap1", Plugin: "p", SourceVolume: "vol1", SourceExternalID: "ext-1",
		Parameters: map[string]string{"k": "v"}, Secrets: map[string]string{"s": "x"},
		ExternalID: "snap-ext", SizeBytes: 42, CreationTime: now, ReadyToUse: true,
		State: SnapshotReady, Revision: 2, CreatedAt: now, UpdatedAt: now,
	}
	for _, id := range []string{"snap2", "snap1"} {
		sn := want
		sn.ID = id
		if err := s.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	got, err := s.Snapshot(ctx, "snap1")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Snapshot after reopen = %+v, %v; want %+v", got, err, want)
	}
	all, err := s.Snapshots(ctx)
	if err != nil || len(all) != 2 || all[0].ID != "snap1" || all[1].ID != "snap2" {
		t.Fatalf("Snapshots = %+v, %v; want snap1, snap2", all, err)
	}
	if err := s.DeleteSnapshot(ctx, "snap1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "snap1"); err != nil {
		t.Fatalf("delete again: %v", err)
	}
	if _, err := s.Snapshot(ctx, "snap1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Snapshot after delete = %v, want ErrNotFound", err)
	}
	if err := s.PutSnapshot(ctx, Snapshot{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("PutSnapshot without an ID = %v, want ErrInvalid", err)
	}
}

// A store written at schema version 1 (no snapshots bucket) gets the
// bucket when this build opens it, and keeps its volumes.
func TestStore_Open_MigratesVersion1(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	v1 := schema{version: 1, buckets: []string{bucketMeta, bucketAllocations, bucketVolumes, bucketVolumesWithWork},
		migrations: map[uint64]func(*bolt.Tx) error{}}
	s, err := open(path, Config{}, v1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(ctx, Volume{ID: "vol1", Plugin: "p", ExternalID: "e"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = open(path, Config{}, currentSchema())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Volume(ctx, "vol1"); err != nil {
		t.Fatalf("volume after migration: %v", err)
	}
	if err := s.PutSnapshot(ctx, Snapshot{ID: "snap1", State: SnapshotCreating}); err != nil {
		t.Fatalf("PutSnapshot after migration: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if v := schemaVersion(t, path); v != SchemaVersion {
		t.Fatalf("schema version %d, want %d", v, SchemaVersion)
	}
}
