package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestParseJournal_RoundTrip(t *testing.T) {
	raw, _, recs := testJournal(1, 3, 1, 2)
	c, err := parseJournal(testJournalFile, raw, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.dropped != "" || !sameRecords(c.records, recs) {
		t.Fatalf("parsed %d records (dropped %q), want the %d written", len(c.records), c.dropped, len(recs))
	}
}

// TestParseJournal_EveryCutIsATornTail cuts a journal at every length: in
// the last generation each cut parses as the whole groups before it, the
// group it cuts dropped; in an earlier generation any cut inside a group
// is damage.
func TestParseJournal_EveryCutIsATornTail(t *testing.T) {
	raw, starts, recs := testJournal(1, 3, 2, 1, 4)
	for cut := 0; cut <= len(raw); cut++ {
		whole := 0 // groups wholly before cut
		for whole+1 < len(starts) && starts[whole+1] <= cut {
			whole++
		}
		atBoundary := cut == journalHeaderSize || cut == starts[whole]
		c, err := parseJournal(testJournalFile, raw[:cut], true)
		if err != nil {
			t.Fatalf("cut at %d in the last generation: %v", cut, err)
		}
		wantRecs := 0
		for _, r := range recs {
			if r.group <= uint64(whole) {
				wantRecs++
			}
		}
		if !sameRecords(c.records, recs[:wantRecs]) {
			t.Fatalf("cut at %d: %d records, want the %d of the %d whole groups", cut, len(c.records), wantRecs, whole)
		}
		if torn := cut < journalHeaderSize || !atBoundary; torn != (c.dropped != "") {
			t.Fatalf("cut at %d: dropped %q, want a drop: %t", cut, c.dropped, torn)
		}
		_, err = parseJournal(testJournalFile, raw[:cut], false)
		if ok := cut >= journalHeaderSize && atBoundary; ok != (err == nil) || (err != nil && !errors.Is(err, ErrCorrupt)) {
			t.Fatalf("cut at %d in an earlier generation: %v, want ErrCorrupt: %t", cut, err, !ok)
		}
	}
}

// TestParseJournal_EveryByteFlip damages each byte after the header in
// turn: damage in the last group drops that group; damage anywhere else is
// ErrCorrupt. No damaged record is ever returned.
func TestParseJournal_EveryByteFlip(t *testing.T) {
	raw, starts, recs := testJournal(2, 1, 3, 2)
	lastStart := starts[len(starts)-2]
	lastGroup := uint64(len(starts) - 1)
	for off := journalHeaderSize; off < len(raw); off++ {
		bad := bytes.Clone(raw)
		bad[off] ^= 0x5a
		c, err := parseJournal(testJournalFile, bad, true)
		if off < lastStart {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d (before the last group) flipped: %v, want ErrCorrupt", off, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("byte %d (in the last group) flipped: %v, want the group dropped", off, err)
		}
		want := 0
		for _, r := range recs {
			if r.group < lastGroup {
				want++
			}
		}
		if !sameRecords(c.records, recs[:want]) || c.dropped == "" {
			t.Fatalf("byte %d flipped: %d records, dropped %q; want the %d before the last group and a drop", off, len(c.records), c.dropped, want)
		}
	}
}

func TestParseJournal_Refused(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(raw []byte, starts []int) []byte
		wantErr error
	}{
		{"bad magic", func(raw []byte, _ []int) []byte { raw[0] = 'X'; return raw }, ErrCorrupt},
		{"bad header checksum", func(raw []byte, _ []int) []byte { raw[21] ^= 1; return raw }, ErrCorrupt},
		{"version 0", func(raw []byte, _ []int) []byte {
			binary.LittleEndian.PutUint32(raw[8:], 0)
			return raw
		}, ErrCorrupt},
		{"newer version", func(raw []byte, _ []int) []byte {
			binary.LittleEndian.PutUint32(raw[8:], journalVersion+1)
			return raw
		}, ErrSchemaTooNew},
		{"generation not the file's", func(raw []byte, _ []int) []byte {
			return append(appendJournalHeader(nil, 7), raw[journalHeaderSize:]...)
		}, ErrCorrupt},
		{"unknown op", func(raw []byte, starts []int) []byte {
			rewriteRecord(raw, starts[1], func(b []byte) { b[0] = 9 })
			return raw
		}, ErrCorrupt},
		{"unknown op in the last record", func(raw []byte, starts []int) []byte {
			rewriteRecord(raw, starts[len(starts)-2], func(b []byte) { b[0] = 9 })
			return raw
		}, ErrCorrupt},
		{"unknown flags", func(raw []byte, starts []int) []byte {
			rewriteRecord(raw, starts[1], func(b []byte) { b[1] |= 0x80 })
			return raw
		}, ErrCorrupt},
		{"group skipped", func(raw []byte, starts []int) []byte {
			rewriteRecord(raw, starts[1], func(b []byte) { binary.LittleEndian.PutUint64(b[2:], 5) })
			return raw
		}, ErrCorrupt},
		{"delete with a value", func(raw []byte, _ []int) []byte {
			return appendJournalRecord(raw, journalOpDelete, journalFlagEnd, 4, "x", []byte("v"))
		}, ErrCorrupt},
		{"bad length followed by good groups", func(raw []byte, starts []int) []byte {
			binary.LittleEndian.PutUint32(raw[starts[1]:], 1<<30)
			return raw
		}, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, starts, _ := testJournal(1, 1, 1)
			raw = tt.damage(raw, starts)
			for _, last := range []bool{true, false} {
				if _, err := parseJournal(testJournalFile, raw, last); !errors.Is(err, tt.wantErr) {
					t.Fatalf("parse (last generation: %t): %v, want %v", last, err, tt.wantErr)
				}
			}
		})
	}
}

// FuzzParseJournal feeds damaged journals to the parser: it must never
// panic, and what it returns must be whole groups, in order.
func FuzzParseJournal(f *testing.F) {
	raw, _, _ := testJournal(1, 3, 2)
	f.Add(raw[journalHeaderSize:], true)
	f.Add(raw[journalHeaderSize:len(raw)-3], true)
	f.Add(make([]byte, 64), false)
	f.Fuzz(func(t *testing.T, body []byte, last bool) {
		file := append(appendJournalHeader(nil, 1), body...)
		c, err := parseJournal(testJournalFile, file, last)
		if err != nil {
			return
		}
		var group uint64
		for i, r := range c.records {
			if r.group != group && r.group != group+1 {
				t.Fatalf("record %d of group %d after group %d", i, r.group, group)
			}
			group = r.group
		}
		if n := len(c.records); n > 0 && c.records[n-1].flags&journalFlagEnd == 0 {
			t.Fatalf("last record returned does not end its group")
		}
	})
}
