package persistence

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// defer_ puts v with PutVolumeDeferred and records it in the model: reads
// must see it at once, like a durable write.
func (m *volumeModel) defer_(t testing.TB, s *Store, v Volume) {
	t.Helper()
	if err := s.PutVolumeDeferred(context.Background(), v); err != nil {
		t.Fatalf("PutVolumeDeferred(%s): %v", v.ID, err)
	}
	m.vols[v.ID], m.ids[v.ID] = v, true
}

// TestStore_PutVolumeDeferred_Durability follows one volume through a
// claim's writes as the volume actor makes them (durable intent, deferred
// steps, durable outcome) and crashes the store after each kind: a
// deferred write is seen by every read at once, and a crash loses it
// unless a durable write or a checkpoint followed it; then Open finds the
// last durable write.
func TestStore_PutVolumeDeferred_Durability(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	reg := prometheus.NewRegistry()
	cfg := noAutoCheckpoint
	cfg.Registerer = reg
	s := openT(t, path, cfg)
	m := newModel()
	rev := func(n uint64) Volume {
		v := volumeWithClaim("vol")
		v.Revision = n
		return v
	}

	m.put(t, s, rev(1))    // reserved: durable
	m.defer_(t, s, rev(2)) // controller-published
	m.defer_(t, s, rev(3)) // staged
	m.checkReads(t, s)
	if got := activeIDs(t, s); len(got) != 1 || got[0] != "vol" {
		t.Errorf("ActiveVolumes after deferred writes = %v, want [vol]", got)
	}
	// The scan above checkpointed: revision 3 is in the file now.
	m.defer_(t, s, rev(4))
	crash(t, s)
	s = openT(t, path, cfg)
	m.vols["vol"] = rev(3) // revision 4 was only in memory
	m.check(t, s)

	m.defer_(t, s, rev(5))
	m.put(t, s, rev(6)) // published: durable, and so is everything before it
	crash(t, s)
	s = openT(t, path, cfg)
	m.check(t, s)

	m.defer_(t, s, rev(7))
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	crash(t, s)
	s = openT(t, path, cfg)
	m.check(t, s) // revision 7, made durable by the checkpoint

	m.defer_(t, s, rev(8))
	if err := s.Close(); err != nil { // Close checkpoints
		t.Fatal(err)
	}
	s = openT(t, path, cfg)
	m.check(t, s)

	m.defer_(t, s, rev(9))
	if got := testutil.ToFloat64(s.m.writesDeferred); got != 1 {
		t.Errorf("deferred writes counted = %v, want 1", got)
	}
}

// TestStore_PutVolumeDeferred_CheckpointedInBackground checks that a
// deferred write with no write after it still reaches the file: the
// checkpoint it arms runs Config.CheckpointDelay later.
func TestStore_PutVolumeDeferred_CheckpointedInBackground(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	s := openT(t, path, Config{CheckpointDelay: 10 * time.Millisecond})
	v := volumeWithClaim("vol")
	if err := s.PutVolumeDeferred(ctxT(t), v); err != nil {
		t.Fatal(err)
	}
	for s.j.pending() { // the checkpointer, not a scan (which checkpoints itself)
		time.Sleep(time.Millisecond)
	}
	crash(t, s)
	s = openT(t, path, Config{})
	got, err := s.Volume(ctxT(t), "vol")
	if err != nil || got.Revision != v.Revision {
		t.Fatalf("after the checkpoint and a crash: %+v, %v; want the deferred write", got, err)
	}
}

// TestStore_PutVolumeDeferred_BadInput checks that a deferred write is
// checked like PutVolume, and refused after Close.
func TestStore_PutVolumeDeferred_BadInput(t *testing.T) {
	checkLeaks(t)
	s := openT(t, storePath(t), Config{})
	if err := s.PutVolumeDeferred(ctxT(t), Volume{}); err == nil || !strings.Contains(err.Error(), "volume id") {
		t.Errorf("empty ID: %v, want an error naming the volume id", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolumeDeferred(context.Background(), volumeWithClaim("v")); err != ErrClosed {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}
