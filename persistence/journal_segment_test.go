package persistence

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

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

// TestStore_Journal_BigRecords writes volumes of tens of KiB, alone and
// in a group with small ones: every write survives a crash, and Close.
func TestStore_Journal_BigRecords(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, noAutoCheckpoint)
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

// TestStore_Journal_LoneWriterNeverLeftWaiting has one writer write for a
// long while, waiting for each write, while the checkpointer checkpoints
// by size: each checkpoint holds the journal's appends.mu for a moment. A write that finds it held queues and waits
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
