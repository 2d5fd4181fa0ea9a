package persistence

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	bolt "go.etcd.io/bbolt"
)

// nextGen returns the generation after the newest journal file of the
// store at path.
func nextGen(t testing.TB, path string) uint64 {
	t.Helper()
	files, err := listJournals(path)
	if err != nil || len(files) == 0 {
		t.Fatalf("journal files: %v, %v", files, err)
	}
	return files[len(files)-1].gen + 1
}

// boltVolumes returns the IDs in the volumes bucket of the file, without
// checkpointing.
func boltVolumes(t testing.TB, s *Store) []string {
	t.Helper()
	var ids []string
	if err := s.view(context.Background(), func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumes)).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestStore_Journal_EveryWriteVisible(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	m := newModel()
	idle := func(id string, rev uint64) Volume {
		return Volume{ID: id, Plugin: "p", ExternalID: "x-" + id, Revision: rev}
	}

	// In the journal only.
	for i := range 20 {
		v := idle(fmt.Sprintf("v%02d", i), 1)
		if i%2 == 0 {
			v = volumeWithClaim(v.ID)
		}
		m.put(t, s, v)
	}
	m.del(t, s, "v03")
	m.del(t, s, "never-stored")
	m.put(t, s, volumeWithClaim("v05")) // idle to active
	m.put(t, s, idle("v04", 2))         // active to idle
	m.put(t, s, idle("v06", 2))
	m.del(t, s, "v06") // put, then deleted, in one generation
	if ids := boltVolumes(t, s); len(ids) != 0 || !s.j.pending() {
		t.Fatalf("before a checkpoint the file holds %v and the journal pending is %t; want nothing and true", ids, s.j.pending())
	}
	m.checkReads(t, s)
	m.checkScans(t, s) // checkpoints
	if s.j.pending() {
		t.Fatal("a scan left writes in the journal")
	}
	m.checkReads(t, s)

	// In the journal over the file: deletes of stored volumes, a deleted
	// one back, index changes both ways.
	m.del(t, s, "v00")
	m.put(t, s, idle("v03", 3))
	m.put(t, s, volumeWithClaim("v07"))
	m.put(t, s, idle("v02", 5))
	m.checkReads(t, s)

	// A crash, then Open replays the journal.
	crash(t, s)
	if len(journalPaths(t, path)) == 0 {
		t.Fatal("no journal file left by the crash")
	}
	s = openT(t, path, noAutoCheckpoint)
	if s.j.pending() {
		t.Fatal("replayed writes are in the overlay, want them in the file")
	}
	m.check(t, s)

	// More, then Close checkpoints and removes the journal.
	m.put(t, s, volumeWithClaim("v19"))
	m.del(t, s, "v01")
	m.put(t, s, volumeWithClaim("new"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if files := journalPaths(t, path); len(files) != 0 {
		t.Fatalf("journal files after Close: %v", files)
	}
	s = openT(t, path, noAutoCheckpoint)
	m.check(t, s)
}

// TestStore_Journal_ReplaysEveryGeneration leaves journal generations as
// crashes at different moments would, and checks that Open applies the
// unapplied ones in order and skips those a checkpoint applied (whose
// removal did not reach the disk).
func TestStore_Journal_ReplaysEveryGeneration(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	rev := func(id string, r uint64) Volume { v := volumeWithClaim(id); v.Revision = r; return v }
	m := newModel()
	// Generation 1, checkpointed.
	m.put(t, s, rev("a", 1))
	m.put(t, s, rev("old", 1))
	gen1 := journalPaths(t, path)[0]
	raw1 := readFile(t, gen1)
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	// Generation 2, rotated out by a checkpoint that waits for bbolt's
	// writer lock, held here.
	m.put(t, s, rev("a", 2))
	m.del(t, s, "old")
	m.put(t, s, rev("b", 2))
	release := s.blockCommitter(t)
	rotated := make(chan error, 1)
	go func() { rotated <- s.checkpoint() }()
	waitFlushing(t, s)
	// Generation 3, the current one.
	m.put(t, s, rev("a", 3))
	m.del(t, s, "b")
	m.checkReads(t, s)
	files := journalPaths(t, path)
	if len(files) != 2 {
		t.Fatalf("journal files %v, want generations 2 and 3", files)
	}
	gen2, raw2 := files[0], readFile(t, files[0])
	release()
	if err := <-rotated; err != nil {
		t.Fatal(err)
	}
	crash(t, s) // leaves generation 3; generation 2 is applied
	dir := filepath.Dir(path)
	crashed := dirFiles(t, dir)

	// Generation 1's removal was lost, generation 2's was not: replaying
	// generation 1 would bring "old" back.
	writeFile(t, gen1, raw1)
	s = openT(t, path, noAutoCheckpoint)
	m.check(t, s)
	if files := journalPaths(t, path); len(files) != 1 {
		t.Fatalf("journal files after Open: %v, want only the new generation", files)
	}

	// The crash came before generation 2's checkpoint committed: Open
	// applies generations 2 and 3, in that order.
	other := filepath.Join(t.TempDir(), filepath.Base(path))
	for name, raw := range crashed {
		writeFile(t, filepath.Join(filepath.Dir(other), name), raw)
	}
	writeFile(t, filepath.Join(filepath.Dir(other), filepath.Base(gen2)), raw2)
	editBolt(t, other, func(tx *bolt.Tx) error { return setJournalApplied(tx, 1) })
	s2 := openT(t, other, noAutoCheckpoint)
	m.check(t, s2)
}

// TestStore_Journal_SameVolumeOrder has many goroutines write one volume
// at once: replay must end where the overlay (and a checkpoint) ended.
func TestStore_Journal_SameVolumeOrder(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	for round := range 2 {
		s := openT(t, path, noAutoCheckpoint)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 50 {
					v := volumeWithClaim("v")
					v.Revision = uint64(w*100 + i)
					if err := s.PutVolume(ctx, v); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		inOverlay, err := s.Volume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			if err := s.checkpoint(); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Volume(ctx, "v"); err != nil || got.Revision != inOverlay.Revision {
				t.Fatalf("after a checkpoint: revision %d (%v), the overlay had %d", got.Revision, err, inOverlay.Revision)
			}
		}
		crash(t, s)
		s = openT(t, path, noAutoCheckpoint)
		got, err := s.Volume(ctx, "v")
		if err != nil || got.Revision != inOverlay.Revision {
			t.Fatalf("round %d, after replay: revision %d (%v), the overlay had %d", round, got.Revision, err, inOverlay.Revision)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFlushing waits until a checkpoint has rotated the journal and is
// flushing the old generation.
func waitFlushing(t testing.TB, s *Store) {
	t.Helper()
	for {
		s.j.ovMu.RLock()
		f := s.j.flushing != nil
		s.j.ovMu.RUnlock()
		if f {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStore_Journal_WritersDoNotWaitForCheckpoint holds a checkpoint inside
// its bbolt transaction and checks that writes still return and that reads
// see both the generation being flushed and the new one.
func TestStore_Journal_WritersDoNotWaitForCheckpoint(t *testing.T) {
	checkLeaks(t)
	s := openT(t, storePath(t), noAutoCheckpoint)
	m := newModel()
	for i := range 10 {
		m.put(t, s, volumeWithClaim(fmt.Sprintf("v%d", i)))
	}
	// bbolt's writer lock is held: the checkpoint rotates the journal,
	// then waits to begin its transaction.
	release := s.blockCommitter(t)
	done := make(chan error, 1)
	go func() { done <- s.checkpoint() }()
	waitFlushing(t, s)

	for i := range 5 {
		v := volumeWithClaim(fmt.Sprintf("v%d", i))
		v.Revision = 10
		m.put(t, s, v) // returns while the checkpoint waits
	}
	m.del(t, s, "v5")
	m.put(t, s, volumeWithClaim("new"))
	m.checkReads(t, s) // v6..v9 from the flushing overlay, the rest from the new one
	select {
	case err := <-done:
		t.Fatalf("checkpoint finished (%v) while bbolt was held", err)
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := boltVolumes(t, s); len(got) != 10 {
		t.Fatalf("after the checkpoint the file holds %v, want v0..v9", got)
	}
	m.check(t, s)
}

func TestStore_Journal_CheckpointsInBackground(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
	}{
		{"size", Config{CheckpointBytes: 4096, CheckpointDelay: time.Hour}},
		{"delay", Config{CheckpointBytes: 1 << 40, CheckpointDelay: time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			reg := prometheus.NewPedanticRegistry()
			tt.cfg.Registerer = reg
			s := openT(t, storePath(t), tt.cfg)
			m := newModel()
			n := 1
			if tt.name == "size" {
				n = 50 // several times 4 KiB
			}
			for i := range n {
				m.put(t, s, volumeWithClaim(fmt.Sprintf("v%02d", i)))
			}
			// Wait for the checkpointer, without a scan (which would
			// checkpoint itself): by size, for a first checkpoint (the
			// last writes may stay below the threshold); by delay, for
			// everything.
			for testutil.ToFloat64(s.m.checkpointsOK) < 1 || (tt.name == "delay" && s.j.pending()) {
				time.Sleep(time.Millisecond)
			}
			got := boltVolumes(t, s)
			if len(got) == 0 || (tt.name == "delay" && len(got) != n) {
				t.Fatalf("after a background checkpoint the file holds %d volumes, want some (size) or all %d (delay)", len(got), n)
			}
			m.checkReads(t, s)
		})
	}
}

func TestStore_Metrics_Checkpoints(t *testing.T) {
	ctx := ctxT(t)
	reg := prometheus.NewPedanticRegistry()
	cfg := noAutoCheckpoint
	cfg.Registerer = reg
	s := openT(t, storePath(t), cfg)
	for i := range 3 {
		if err := s.PutVolume(ctx, volumeWithClaim(fmt.Sprintf("v%d", i))); err != nil {
			t.Fatal(err)
		}
		if err := s.checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.checkpoint(); err != nil { // nothing to do: not counted
		t.Fatal(err)
	}
	want := `
# HELP csiactor_store_checkpoints_total Checkpoints of the store journal into the store file by result: ok, or error (the writes stay in the journal and the checkpoint is retried).
# TYPE csiactor_store_checkpoints_total counter
csiactor_store_checkpoints_total{result="error"} 0
csiactor_store_checkpoints_total{result="ok"} 3
# HELP csiactor_store_writes_total Store writes by result: ok (durable when it returned), deferred (a volume claim step kept in memory and made durable by the next checkpoint, see PutVolumeDeferred), error (rejected by the store or the disk) or canceled (the caller's context ended before the write was applied).
# TYPE csiactor_store_writes_total counter
csiactor_store_writes_total{result="canceled"} 0
csiactor_store_writes_total{result="deferred"} 0
csiactor_store_writes_total{result="error"} 0
csiactor_store_writes_total{result="ok"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csiactor_store_checkpoints_total", "csiactor_store_writes_total"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(s.m.checkpointSeconds); got != 1 {
		t.Fatalf("checkpoint_seconds: %d series, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "csiactor_store_commit_batch_size"); err != nil || n != 1 {
		t.Fatalf("commit_batch_size: %d series, %v", n, err)
	}
}

// journaledStore writes n volumes into a new store at path, each in its
// own group (one lone write after another), and crashes it, leaving them
// in the journal. It returns the one journal file.
func journaledStore(t *testing.T, path string, n int) string {
	t.Helper()
	s := openT(t, path, noAutoCheckpoint)
	for i := range n {
		if err := s.PutVolume(context.Background(), volumeWithClaim(fmt.Sprintf("v%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, s)
	files := journalPaths(t, path)
	if len(files) != 1 {
		t.Fatalf("journal files %v, want one", files)
	}
	return files[0]
}

func TestStore_Open_JournalTornTailDropped(t *testing.T) {
	tests := []struct {
		name string
		// tear damages the journal file jf of the store at path holding
		// v0..v4 in five groups, and returns how many of them survive.
		tear func(t *testing.T, path, jf string, offs []int) int
		// clean is set where what survives reads as the journal's end:
		// nothing is dropped, no log line.
		clean bool
	}{
		{"last record cut short", func(t *testing.T, path, jf string, offs []int) int {
			truncate(t, jf, int64(offs[5]-3))
			return 4
		}, false},
		{"last record frame cut short", func(t *testing.T, path, jf string, offs []int) int {
			truncate(t, jf, int64(offs[4]+3))
			return 4
		}, false},
		{"last record checksum wrong", func(t *testing.T, path, jf string, offs []int) int {
			flipByte(t, jf, int64(offs[4]+20))
			return 4
		}, false},
		{"zeros after the last record", func(t *testing.T, path, jf string, offs []int) int {
			appendBytes(t, jf, make([]byte, 4096))
			return 5
		}, false},
		{"zeros over the last record", func(t *testing.T, path, jf string, offs []int) int {
			f, err := os.OpenFile(jf, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, offs[5]-offs[4]), int64(offs[4])); err != nil {
				t.Fatal(err)
			}
			return 4
		}, true}, // in a preallocated file, a record never written
		{"new generation with its header cut short", func(t *testing.T, path, jf string, offs []int) int {
			gen := nextGen(t, path)
			if err := os.WriteFile(journalName(path, gen), appendJournalHeader(nil, gen)[:10], 0o600); err != nil {
				t.Fatal(err)
			}
			return 5
		}, false},
		{"new empty generation", func(t *testing.T, path, jf string, offs []int) int {
			if err := os.WriteFile(journalName(path, nextGen(t, path)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return 5
		}, false},
		{"torn generation before one with only a header", func(t *testing.T, path, jf string, offs []int) int {
			// A checkpoint creates the next file before it swaps: a
			// crash then can tear the older one.
			truncate(t, jf, int64(offs[5]-1))
			gen := nextGen(t, path)
			if err := os.WriteFile(journalName(path, gen), appendJournalHeader(nil, gen), 0o600); err != nil {
				t.Fatal(err)
			}
			return 4
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			path := storePath(t)
			jf := journaledStore(t, path, 5)
			want := tt.tear(t, path, jf, recordOffsets(t, readFile(t, jf)))

			cfg, hook := hookedConfig()
			s, err := Open(path, cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			switch dropped := logged(hook, logrus.WarnLevel, "cut short by a crash"); {
			case !dropped && want < 5 && !tt.clean:
				t.Errorf("no log line about the dropped write; logged: %v", hook.AllEntries())
			case dropped && tt.clean:
				t.Errorf("a log line about a dropped write where the journal just ends; logged: %v", hook.AllEntries())
			}
			m := newModel()
			for i := range 5 {
				id := fmt.Sprintf("v%d", i)
				m.ids[id] = true
				if i < want {
					m.vols[id] = volumeWithClaim(id)
				}
			}
			m.check(t, s)
			// Usable: a write, a Close, an Open.
			m.put(t, s, volumeWithClaim("after"))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, path, noAutoCheckpoint)
			m.checkReads(t, s)
		})
	}
}

// TestStore_Open_JournalIncompleteGroupDropped makes one group of three
// writes and cuts the file after the second: the group's write did not
// finish, so none of it is applied.
func TestStore_Open_JournalIncompleteGroupDropped(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	if err := s.PutVolume(ctx, volumeWithClaim("first")); err != nil {
		t.Fatal(err)
	}
	release := s.blockJournal(t)
	errs := make(chan error, 3)
	for i := range 3 {
		go func() { errs <- s.PutVolume(ctx, volumeWithClaim(fmt.Sprintf("g%d", i))) }()
	}
	waitQueued(t, &s.j.appends, 3)
	release()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	crash(t, s)
	jf := journalPaths(t, path)[0]
	offs := recordOffsets(t, readFile(t, jf))
	if len(offs) != 5 {
		t.Fatalf("%d records, want 4", len(offs)-1)
	}
	truncate(t, jf, int64(offs[3])) // after the group's second record

	cfg, hook := hookedConfig()
	s = openT(t, path, cfg)
	if !logged(hook, logrus.WarnLevel, "has no end") {
		t.Errorf("no log line about the dropped group; logged: %v", hook.AllEntries())
	}
	if ids, err := s.VolumeIDs(ctx); err != nil || !slices.Equal(ids, []string{"first"}) {
		t.Fatalf("VolumeIDs = %v, %v; want [first]", ids, err)
	}
}

func TestStore_Open_JournalCorrupt(t *testing.T) {
	tests := []struct {
		name string
		// damage changes the journal file jf of a store holding v0..v4 in
		// five groups (offs: record offsets and the file's length).
		damage func(t *testing.T, path, jf string, offs []int)
	}{
		{"bad record followed by good ones", func(t *testing.T, _, jf string, offs []int) {
			flipByte(t, jf, int64(offs[2]+30))
		}},
		{"bad length followed by good records", func(t *testing.T, _, jf string, offs []int) {
			flipByte(t, jf, int64(offs[1]+2))
		}},
		{"bad header", func(t *testing.T, _, jf string, _ []int) {
			flipByte(t, jf, 3)
		}},
		{"bad header checksum", func(t *testing.T, _, jf string, _ []int) {
			flipByte(t, jf, 21)
		}},
		{"unknown op", func(t *testing.T, _, jf string, offs []int) {
			raw := readFile(t, jf)
			rewriteRecord(raw, offs[4], func(b []byte) { b[0] = 7 })
			writeFile(t, jf, raw)
		}},
		{"torn generation followed by a written one", func(t *testing.T, path, jf string, offs []int) {
			truncate(t, jf, int64(offs[5]-1))
			gen := nextGen(t, path)
			raw := appendJournalRecord(appendJournalHeader(nil, gen), journalOpDelete, journalFlagEnd, 1, "v0", nil)
			writeFile(t, journalName(path, gen), raw)
		}},
		{"header cut short in a generation followed by a written one", func(t *testing.T, path, jf string, _ []int) {
			truncate(t, jf, 12)
			gen := nextGen(t, path)
			raw := appendJournalRecord(appendJournalHeader(nil, gen), journalOpDelete, journalFlagEnd, 1, "v0", nil)
			writeFile(t, journalName(path, gen), raw)
		}},
		{"journal next to a new store file", func(t *testing.T, path, _ string, _ []int) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
		{"journal next to an empty store file", func(t *testing.T, path, _ string, _ []int) {
			truncate(t, path, 0)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			path := storePath(t)
			// v0..v2 are in the file; the journal rewrites them and adds
			// v3 and v4.
			s := openT(t, path, noAutoCheckpoint)
			for i := range 3 {
				if err := s.PutVolume(ctxT(t), Volume{ID: fmt.Sprintf("v%d", i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			jf := journaledStore(t, path, 5)
			tt.damage(t, path, jf, recordOffsets(t, readFile(t, jf)))
			dir := filepath.Dir(path)
			before := dirFiles(t, dir)

			for range 2 { // the second Open fails the same way: the first left nothing locked
				s, err := Open(path, noAutoCheckpoint)
				if err == nil {
					_ = s.Close()
					t.Fatal("Open of a store with a damaged journal succeeded")
				}
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open: %v, want ErrCorrupt", err)
				}
				t.Logf("Open: %v", err)
				assertDirUnchanged(t, dir, before)
			}
		})
	}
}

func TestStore_Open_JournalTooNew(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	jf := journaledStore(t, path, 3)
	raw := readFile(t, jf)
	// A newer format keeps magic and version where they are; the rest
	// may differ.
	raw[8] = byte(journalVersion + 1)
	writeFile(t, jf, raw)
	dir := filepath.Dir(path)
	before := dirFiles(t, dir)
	_, err := Open(path, Config{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open: %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(journalVersion+1)) || !strings.Contains(err.Error(), jf) {
		t.Errorf("error %q should name the journal file and its version", err)
	}
	assertDirUnchanged(t, dir, before)
}

// TestStore_Journal_ConcurrentWritersAndCheckpoints runs many writers, on
// volumes of their own and on shared ones, while checkpoints run all the
// time (tiny thresholds) and readers scan. Each writer reads back every
// write it made at once; at the end the store holds the last write of
// each volume, and so does a reopened store.
func TestStore_Journal_ConcurrentWritersAndCheckpoints(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	cfg := Config{NoSync: true, CheckpointBytes: 4096, CheckpointDelay: time.Millisecond}
	s := openT(t, path, cfg)
	const writers, rounds, own, shared = 16, 60, 5, 4
	var (
		sharedMu   [shared]sync.Mutex
		sharedLast [shared]*Volume // guarded by sharedMu[i]; nil: deleted
		ownLast    [writers][own]*Volume
	)
	errs := make(chan error, writers+2)
	stopReaders := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stopReaders:
					return
				default:
				}
				if _, err := s.ActiveVolumes(ctx); err != nil {
					errs <- fmt.Errorf("ActiveVolumes: %w", err)
					return
				}
				if err := s.ForEachVolume(ctx, func(Volume) error { return nil }); err != nil {
					errs <- fmt.Errorf("ForEachVolume: %w", err)
					return
				}
			}
		})
	}
	// readBack checks that the write just returned is what Volume sees
	// (want nil: deleted); only this writer writes id right now.
	readBack := func(id string, want *Volume) error {
		got, err := s.Volume(ctx, id)
		switch {
		case want == nil && !errors.Is(err, ErrNotFound):
			return fmt.Errorf("Volume(%s) after its delete returned: %v, want ErrNotFound", id, err)
		case want != nil && err != nil:
			return fmt.Errorf("Volume(%s) after its put returned: %w", id, err)
		case want != nil && !reflect.DeepEqual(got, *want):
			return fmt.Errorf("Volume(%s) after its put returned: revision %d, want %d", id, got.Revision, want.Revision)
		}
		return nil
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				for k := range own {
					id := fmt.Sprintf("w%02d-%d", w, k)
					var want *Volume
					if (r+k)%5 == 4 {
						if err := s.DeleteVolume(ctx, id); err != nil {
							errs <- err
							return
						}
					} else {
						v := volumeWithClaim(id)
						if r%2 == 1 {
							v = Volume{ID: id, Plugin: "p"}
						}
						v.Revision = uint64(r)
						if err := s.PutVolume(ctx, v); err != nil {
							errs <- err
							return
						}
						want = &v
					}
					if err := readBack(id, want); err != nil {
						errs <- err
						return
					}
					ownLast[w][k] = want
				}
				// A shared volume, one writer at a time (as its volume
				// actor would be), so that the last write is known.
				i := (w + r) % shared
				id := fmt.Sprintf("shared-%d", i)
				sharedMu[i].Lock()
				var want *Volume
				if r%7 == 6 {
					if err := s.DeleteVolume(ctx, id); err != nil {
						sharedMu[i].Unlock()
						errs <- err
						return
					}
				} else {
					v := volumeWithClaim(id)
					v.Revision = uint64(w*1000 + r)
					if err := s.PutVolume(ctx, v); err != nil {
						sharedMu[i].Unlock()
						errs <- err
						return
					}
					want = &v
				}
				err := readBack(id, want)
				sharedLast[i] = want
				sharedMu[i].Unlock()
				if err != nil {
					errs <- err
					return
				}
				// And a volume every writer writes at once, unordered.
				v := volumeWithClaim("contended")
				v.Revision = uint64(w*1000 + r)
				if err := s.PutVolume(ctx, v); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(stopReaders)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.m.checkpointsOK); got < 2 {
		t.Fatalf("%v checkpoints ran, want many", got)
	}

	m := newModel()
	for w := range writers {
		for k := range own {
			id := fmt.Sprintf("w%02d-%d", w, k)
			m.ids[id] = true
			if v := ownLast[w][k]; v != nil {
				m.vols[id] = *v
			}
		}
	}
	for i := range shared {
		id := fmt.Sprintf("shared-%d", i)
		m.ids[id] = true
		if v := sharedLast[i]; v != nil {
			m.vols[id] = *v
		}
	}
	contended, err := s.Volume(ctx, "contended")
	if err != nil {
		t.Fatal(err)
	}
	m.ids["contended"], m.vols["contended"] = true, contended
	m.check(t, s)

	// The journal's order is the overlay's: a crash and replay give the
	// same state.
	m.put(t, s, volumeWithClaim("last"))
	crash(t, s)
	s = openT(t, path, cfg)
	m.check(t, s)
}

func flipByte(t testing.TB, path string, off int64) {
	t.Helper()
	raw := readFile(t, path)
	raw[off] ^= 0x5a
	writeFile(t, path, raw)
}

func appendBytes(t testing.TB, path string, b []byte) {
	t.Helper()
	writeFile(t, path, append(readFile(t, path), b...))
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
