package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sirupsen/logrus"
)

func (k segmentKind) String() string {
	switch k {
	case segmentAuto:
		return "auto"
	case segmentPlain:
		return "plain"
	case segmentMapped:
		return "mapped"
	case segmentPwrite:
		return "pwrite"
	}
	return fmt.Sprintf("segmentKind(%d)", int(k))
}

// skipUnmapped skips tests of mapped segments where there are none.
func skipUnmapped(t *testing.T) {
	t.Helper()
	if !mmapJournal {
		t.Skip("journal segments are not mapped on this system")
	}
}

// forPreallocated runs test once for each kind of preallocated segment,
// where there are such segments.
func forPreallocated(t *testing.T, test func(t *testing.T, kind segmentKind)) {
	skipUnmapped(t)
	for _, kind := range []segmentKind{segmentMapped, segmentPwrite} {
		t.Run(kind.String(), func(t *testing.T) { test(t, kind) })
	}
}

// TestParseJournal_ZeroTailIsTheEnd pads a journal, cut at every length,
// with the zeros of a preallocated file: cut between groups it parses as
// those groups, nothing dropped, in any generation; cut inside a group it
// parses as a torn tail in the last generation (the group dropped) and as
// damage in an earlier one. A file of zeros is a lost header.
func TestParseJournal_ZeroTailIsTheEnd(t *testing.T) {
	raw, starts, recs := testJournal(1, 3, 2, 1)
	zeros := make([]byte, 3*4096)
	for cut := journalHeaderSize; cut <= len(raw); cut++ {
		whole := 0 // groups wholly before cut
		for whole+1 < len(starts) && starts[whole+1] <= cut {
			whole++
		}
		wantRecs := 0
		for _, r := range recs {
			if r.group <= uint64(whole) {
				wantRecs++
			}
		}
		atBoundary := cut == journalHeaderSize || cut == starts[whole]
		// A record's own trailing zeros, cut off, are not a cut.
		trimmed := cut
		for trimmed > 0 && raw[trimmed-1] == 0 {
			trimmed--
		}
		padded := append(slices.Clone(raw[:trimmed]), zeros...)
		for _, last := range []bool{true, false} {
			c, err := parseJournal(testJournalFile, padded, last)
			switch {
			case atBoundary && (err != nil || c.dropped != "" || !sameRecords(c.records, recs[:wantRecs])):
				t.Fatalf("cut at %d between groups, zeros after (last generation: %t): %d records, dropped %q, %v; want the %d records of the %d whole groups",
					cut, last, len(c.records), c.dropped, err, wantRecs, whole)
			case !atBoundary && last && (err != nil || c.dropped == "" || !sameRecords(c.records, recs[:wantRecs])):
				t.Fatalf("cut at %d inside a group, zeros after: %d records, dropped %q, %v; want the %d records of the %d whole groups and a drop",
					cut, len(c.records), c.dropped, err, wantRecs, whole)
			case !atBoundary && !last && !errors.Is(err, ErrCorrupt):
				t.Fatalf("cut at %d inside a group of an earlier generation, zeros after: %v, want ErrCorrupt", cut, err)
			}
		}
	}
	c, err := parseJournal(testJournalFile, zeros, true)
	if err != nil || c.dropped == "" || len(c.records) != 0 {
		t.Fatalf("a file of zeros as the last generation: %d records, dropped %q, %v; want a dropped header", len(c.records), c.dropped, err)
	}
	if _, err := parseJournal(testJournalFile, zeros, false); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a file of zeros as an earlier generation: %v, want ErrCorrupt", err)
	}
	// Zeros, then a good record: the zeros are damage, not the end.
	bad := append(append(slices.Clone(raw[:starts[1]]), make([]byte, 100)...), raw[starts[1]:]...)
	if _, err := parseJournal(testJournalFile, bad, true); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("zeros followed by a good record: %v, want ErrCorrupt", err)
	}
}

// TestStore_Journal_ZeroTailAfterCrash checks that a crash leaves a mapped
// segment at its preallocated size, its unwritten tail zeros, and that
// Open reads that as the journal's end: every write there, nothing
// reported dropped.
func TestStore_Journal_ZeroTailAfterCrash(t *testing.T) {
	forPreallocated(t, testZeroTailAfterCrash)
}

func testZeroTailAfterCrash(t *testing.T, kind segmentKind) {
	checkLeaks(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	s.setSegmentKind(t, kind)
	m := newModel()
	for i := range 5 {
		m.put(t, s, volumeWithClaim(fmt.Sprintf("v%d", i)))
	}
	crash(t, s)
	files := journalPaths(t, path)
	raw := readFile(t, files[len(files)-1])
	offs := recordOffsets(t, raw)
	if int64(len(raw)) != segmentBytes(noAutoCheckpoint) || len(offs) != 6 || !allZero(raw[offs[5]:]) {
		t.Fatalf("journal file of %d bytes, records end at %d; want %d bytes, 5 records, zeros after them",
			len(raw), offs[len(offs)-1], segmentBytes(noAutoCheckpoint))
	}
	cfg, hook := hookedConfig()
	s = openT(t, path, cfg)
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("Open logged %q", e.Message)
		}
	}
	m.check(t, s)
}

// TestStore_Journal_GenerationFull writes far more than a segment holds,
// with no checkpoint running: each writer that finds its group does not
// fit starts the next generation. Reads see every write, a checkpoint
// moves every generation into bbolt and removes their files, and replay
// after a crash applies every generation in order, down to the last of
// many writes of one volume spread over all of them.
func TestStore_Journal_GenerationFull(t *testing.T) {
	skipUnmapped(t)
	for _, tt := range []struct {
		synced bool
		kind   segmentKind
	}{{false, segmentAuto}, {true, segmentAuto}, {false, segmentPwrite}, {true, segmentMapped}} {
		t.Run(fmt.Sprintf("sync=%t/%s", tt.synced, tt.kind), func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			cfg := noAutoCheckpoint
			cfg.NoSync = !tt.synced
			s := openT(t, path, cfg)
			const segBytes = 2 * pageBytes
			if err := s.setSegments(tt.kind, segBytes); err != nil {
				t.Fatal(err)
			}
			m := newModel()
			write := func(round int) {
				// Sequential writes, each its own group, and concurrent
				// ones that form groups; "same" is rewritten all along.
				for i := range 40 {
					v := volumeWithClaim(fmt.Sprintf("r%d-v%02d", round, i))
					if i%3 == 0 {
						v = Volume{ID: v.ID, Plugin: "p", Revision: uint64(i)}
					}
					m.put(t, s, v)
					same := volumeWithClaim("same")
					same.Revision = uint64(round*1000 + i)
					m.put(t, s, same)
					if i%5 == 4 {
						m.del(t, s, fmt.Sprintf("r%d-v%02d", round, i-2))
					}
				}
				var wg sync.WaitGroup
				vols := make([]Volume, 32)
				for w := range vols {
					vols[w] = volumeWithClaim(fmt.Sprintf("r%d-c%02d", round, w))
					wg.Go(func() {
						if err := s.PutVolume(ctx, vols[w]); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				for _, v := range vols {
					m.vols[v.ID], m.ids[v.ID] = v, true
				}
			}
			write(0)
			files := journalPaths(t, path)
			s.j.appends.lock()
			full := len(s.j.full)
			s.j.appends.unlock()
			if len(files) < 5 || full != len(files)-1 {
				t.Fatalf("%d journal files, %d full generations in the overlay; want many, all but the current one full", len(files), full)
			}
			for _, f := range files {
				// A group of concurrent writes may be bigger than a
				// segment, and get one sized for it.
				if fi, err := os.Stat(f); err != nil || fi.Size() < segBytes || fi.Size()%pageBytes != 0 {
					t.Fatalf("journal file %s: %v; want %d bytes or more, whole pages", f, err, segBytes)
				}
			}
			m.checkReads(t, s)

			// A checkpoint takes every generation.
			if err := s.checkpoint(); err != nil {
				t.Fatal(err)
			}
			if files := journalPaths(t, path); len(files) != 1 {
				t.Fatalf("journal files after a checkpoint: %v, want the new generation only", files)
			}
			m.check(t, s)

			// A crash, then replay of many generations.
			write(1)
			if n := len(journalPaths(t, path)); n < 5 {
				t.Fatalf("%d journal files, want many", n)
			}
			crash(t, s)
			cfg2, hook := hookedConfig()
			s = openT(t, path, cfg2)
			if !logged(hook, logrus.InfoLevel, "replayed store journal") || logged(hook, logrus.WarnLevel, "") {
				t.Errorf("Open logged %v; want a replay and no warning", hook.AllEntries())
			}
			m.check(t, s)
		})
	}
}

// TestStore_Journal_RecordBiggerThanGeneration writes volumes far bigger
// than a segment, alone and in a group with small ones: each group gets a
// segment sized to fit it, and survives a checkpoint and a crash.
func TestStore_Journal_RecordBiggerThanGeneration(t *testing.T) {
	forPreallocated(t, testRecordBiggerThanGeneration)
}

func testRecordBiggerThanGeneration(t *testing.T, kind segmentKind) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	const segBytes = 2 * pageBytes
	if err := s.setSegments(kind, segBytes); err != nil {
		t.Fatal(err)
	}
	big := func(id string, kib int) Volume {
		v := volumeWithClaim(id)
		v.Parameters = map[string]string{"blob": strings.Repeat(id[:1], kib<<10)}
		return v
	}
	m := newModel()
	m.put(t, s, volumeWithClaim("small-0"))
	m.put(t, s, big("big-1", 40))
	m.put(t, s, volumeWithClaim("small-1"))
	// A group of a big one and small ones.
	release := s.blockJournal(t)
	vols := []Volume{volumeWithClaim("small-2"), big("big-2", 100), volumeWithClaim("small-3")}
	errs := make(chan error, len(vols))
	for _, v := range vols {
		go func() { errs <- s.PutVolume(ctx, v) }()
	}
	waitQueued(t, &s.j.appends, len(vols))
	release()
	for range vols {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range vols {
		m.vols[v.ID], m.ids[v.ID] = v, true
	}
	m.checkReads(t, s)
	var sizes []int64
	for _, f := range journalPaths(t, path) {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, fi.Size())
	}
	if len(sizes) < 3 || slices.Max(sizes) < 100<<10 || slices.Min(sizes) != segBytes {
		t.Fatalf("journal file sizes %v: want segments of %d and ones sized for the big groups", sizes, segBytes)
	}
	crash(t, s)
	s = openT(t, path, noAutoCheckpoint)
	m.check(t, s)
	m.put(t, s, big("big-3", 64))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	m.checkReads(t, s)
}

// TestStore_Journal_FileTruncatedUnderMapping has another program truncate
// the mapped journal file under an open store: the next write through the
// mapping faults, which must fail that write (not kill the process with
// SIGBUS) and nothing else; the journal then refuses writes until a
// checkpoint replaces its segment, after which writes work again.
func TestStore_Journal_FileTruncatedUnderMapping(t *testing.T) {
	skipUnmapped(t)
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	s.setSegmentKind(t, segmentMapped)
	m := newModel()
	m.put(t, s, volumeWithClaim("before"))
	files := journalPaths(t, path)
	if len(files) != 1 {
		t.Fatalf("journal files %v, want one", files)
	}
	truncate(t, files[0], 0)
	err := s.PutVolume(ctx, volumeWithClaim("lost"))
	if err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("PutVolume into a truncated mapping: %v, want an error", err)
	}
	t.Logf("PutVolume: %v", err)
	m.ids["lost"] = true
	m.checkReads(t, s)
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	m.put(t, s, volumeWithClaim("after"))
	m.check(t, s)
}

// TestStore_Journal_PlainSegments runs the journal on plain segments
// (write(2), as on systems without mappings) through writes, a crash and
// replay, and a switch back to mapped ones.
func TestStore_Journal_PlainSegments(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
	s.setSegmentKind(t, segmentPlain)
	m := newModel()
	for i := range 20 {
		m.put(t, s, volumeWithClaim(fmt.Sprintf("v%02d", i)))
	}
	m.del(t, s, "v03")
	files := journalPaths(t, path)
	raw := readFile(t, files[len(files)-1])
	if offs := recordOffsets(t, raw); len(offs) != 22 || offs[21] != len(raw) {
		t.Fatalf("plain journal file of %d bytes, records end at %d: want it to end with its 21 records", len(raw), offs[len(offs)-1])
	}
	crash(t, s)
	s = openT(t, path, noAutoCheckpoint)
	m.checkReads(t, s)
	for _, kind := range []segmentKind{segmentPlain, segmentMapped, segmentPwrite, segmentAuto} {
		s.setSegmentKind(t, kind)
		m.put(t, s, volumeWithClaim(fmt.Sprintf("kind-%d", kind)))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	m.check(t, s)
	if _, err := os.Stat(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
}

// TestStore_Journal_LoneWriterNeverLeftWaiting has one writer write for a
// long while, waiting for each write, while the checkpointer prefaults
// segments and checkpoints by size: each of those holds the journal's
// appends.mu for a moment. A write that finds it held queues and waits
// for the holder to append it or wake the journal committer; with no
// other writer and no timed checkpoint, a holder that released it without
// doing either would leave it waiting for good (until ctx ends).
func TestStore_Journal_LoneWriterNeverLeftWaiting(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{NoSync: true, CheckpointBytes: 1 << 20, CheckpointDelay: time.Hour})
	v := volumeWithClaim("v")
	for i := range 30_000 {
		v.Revision = uint64(i)
		if err := s.PutVolume(ctx, v); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if got := testutil.ToFloat64(s.m.checkpointsOK); got < 5 {
		t.Fatalf("%v checkpoints ran, want many", got)
	}
}
