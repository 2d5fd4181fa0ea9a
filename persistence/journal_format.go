package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The journal is a sequence of generations, each one file next to the
// store file named "<store file>.journal.<generation>" (decimal). A file is
// a header and then records, appended one group at a time. Zeros after
// the records are the journal's end too: files of earlier versions were
// preallocated, zeros up to their size, and Open still replays them. A record never starts with zeros
// (its length is at least journalBodyFixed).
//
// Header, journalHeaderSize bytes, little-endian:
//
//	magic      [8]byte  "csiajrnl"
//	version    uint32   journalVersion; a later format keeps magic and version here
//	generation uint64   as in the file name
//	crc        uint32   CRC-32C (Castagnoli) of the 20 bytes above
//
// Record: a frame, then its body.
//
//	length uint32  of the body
//	crc    uint32  CRC-32C of the body
//	body:
//	  op       byte    journalOpPut or journalOpDelete
//	  flags    byte    journalFlagEnd | journalFlagActive
//	  group    uint64  the group (write) this record was appended in: 1, 2, 3, ... in the file
//	  idLen    uint16
//	  id       [idLen]byte
//	  value    the rest: the encoded volume (put), nothing (delete)
//
// Every group's last record has journalFlagEnd, so replay knows whether a
// group is complete: a crash during an append leaves at most the file's
// last group incomplete or torn, and replay drops that group whole. A
// header of zeros in a file of zeros (a preallocated file whose header a
// crash of the machine lost), like a header cut short, is dropped in the
// last generation.
const (
	journalMagic          = "csiajrnl"
	journalVersion uint32 = 1
	// journalHeaderSize is the size of a journal file's header.
	journalHeaderSize = 24
	// journalFrameSize is the size of a record's length and CRC.
	journalFrameSize = 8
	// journalBodyFixed is the size of a record body without id and value.
	journalBodyFixed = 12
	// journalMaxBody bounds a record body: a longer length field is damage.
	journalMaxBody = 64 << 20

	journalOpPut    byte = 1
	journalOpDelete byte = 2

	// journalFlagEnd marks the last record of a group.
	journalFlagEnd byte = 1
	// journalFlagActive marks a put of a volume for which Volume.Active is
	// true, so that replay and checkpoints keep the volumes_with_work
	// index without decoding the record.
	journalFlagActive byte = 2
	journalFlagsKnown      = journalFlagEnd | journalFlagActive
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// journalName returns the file name of generation gen of the journal of
// the store file named base.
func journalName(base string, gen uint64) string {
	return base + ".journal." + strconv.FormatUint(gen, 10)
}

// appendJournalHeader appends the header of generation gen to dst.
func appendJournalHeader(dst []byte, gen uint64) []byte {
	start := len(dst)
	dst = append(dst, journalMagic...)
	dst = binary.LittleEndian.AppendUint32(dst, journalVersion)
	dst = binary.LittleEndian.AppendUint64(dst, gen)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// appendJournalRecord appends one record to dst.
func appendJournalRecord(dst []byte, op, flags byte, group uint64, id string, value []byte) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(journalBodyFixed+len(id)+len(value)))
	dst = append(dst, 0, 0, 0, 0) // CRC, below
	dst = append(dst, op, flags)
	dst = binary.LittleEndian.AppendUint64(dst, group)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(id)))
	dst = append(dst, id...)
	dst = append(dst, value...)
	body := dst[start+journalFrameSize:]
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(body, castagnoli))
	return dst
}

// journalRecord is one decoded record. id and value point into the bytes
// it was decoded from.
type journalRecord struct {
	op, flags byte
	group     uint64
	id        []byte
	value     []byte
}

// errBadFrame is a record whose frame does not hold: short, an impossible
// length, or a body whose CRC does not match. At the end of a file that is
// what a crash during an append leaves.
var errBadFrame = errors.New("bad frame")

// decodeJournalRecord decodes the record at the start of b and returns it
// with its size. The error wraps errBadFrame when the frame does not hold;
// a frame that holds with a body this build cannot read (unknown op or
// flags, impossible id length) is any other error.
func decodeJournalRecord(b []byte) (journalRecord, int, error) {
	if len(b) < journalFrameSize {
		return journalRecord{}, 0, fmt.Errorf("%w: %d bytes, shorter than a record frame", errBadFrame, len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if n < journalBodyFixed || n > journalMaxBody {
		return journalRecord{}, 0, fmt.Errorf("%w: record length %d", errBadFrame, n)
	}
	size := journalFrameSize + int(n)
	if size > len(b) {
		return journalRecord{}, 0, fmt.Errorf("%w: record of %d bytes, %d left in the file", errBadFrame, size, len(b))
	}
	body := b[journalFrameSize:size]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return journalRecord{}, 0, fmt.Errorf("%w: checksum mismatch", errBadFrame)
	}
	r := journalRecord{op: body[0], flags: body[1], group: binary.LittleEndian.Uint64(body[2:])}
	idLen := int(binary.LittleEndian.Uint16(body[10:]))
	switch {
	case r.flags&^journalFlagsKnown != 0:
		return journalRecord{}, 0, fmt.Errorf("unknown record flags %#x", r.flags)
	case r.group == 0:
		return journalRecord{}, 0, errors.New("record of group 0")
	case idLen == 0 || journalBodyFixed+idLen > len(body):
		return journalRecord{}, 0, fmt.Errorf("record id of %d bytes in a body of %d", idLen, len(body))
	}
	r.id = body[journalBodyFixed : journalBodyFixed+idLen]
	r.value = body[journalBodyFixed+idLen:]
	switch {
	case r.op == journalOpPut && len(r.value) == 0:
		return journalRecord{}, 0, errors.New("put record without a value")
	case r.op == journalOpDelete && (len(r.value) != 0 || r.flags&journalFlagActive != 0):
		return journalRecord{}, 0, errors.New("delete record with a value or the active flag")
	case r.op != journalOpPut && r.op != journalOpDelete:
		return journalRecord{}, 0, fmt.Errorf("unknown record op %d", r.op)
	}
	return r, size, nil
}

// journalFile is one generation found on disk.
type journalFile struct {
	path string
	gen  uint64
}

// listJournals returns the journal files of the store file at path,
// oldest generation first. Files whose names do not end in a generation
// number are not the journal's and are left alone.
func listJournals(path string) ([]journalFile, error) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+".journal."
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list journal files in %s: %w", dir, err)
	}
	var out []journalFile
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		gen, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || gen == 0 || rest != strconv.FormatUint(gen, 10) {
			continue
		}
		out = append(out, journalFile{path: filepath.Join(dir, e.Name()), gen: gen})
	}
	slices.SortFunc(out, func(a, b journalFile) int { return cmpUint64(a.gen, b.gen) })
	return out, nil
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// journalContent is what parseJournal found in one file.
type journalContent struct {
	records []journalRecord
	// dropped describes the incomplete or torn last group (or header)
	// that was dropped, "" if none.
	dropped string
}

// parseJournal checks and decodes one journal file's bytes. last says
// whether it is the newest generation, the only one a crash can leave
// unfinished: there an incomplete or torn last group (or a header cut
// short) is dropped and described in dropped; anywhere else it is damage.
//
// Errors wrap ErrCorrupt (a bad header, a bad record followed by a good
// one of a later group, a record this build cannot read, groups out of
// order) or ErrSchemaTooNew (a newer journal format).
func parseJournal(jf journalFile, raw []byte, last bool) (journalContent, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("store journal %s: %s: %w", jf.path, fmt.Sprintf(format, args...), ErrCorrupt)
	}
	var out journalContent
	// end is where the zeros at the file's end start.
	end := len(raw)
	for end > 0 && raw[end-1] == 0 {
		end--
	}
	switch {
	case len(raw) < journalHeaderSize && last:
		out.dropped = fmt.Sprintf("header cut short (%d of %d bytes)", len(raw), journalHeaderSize)
		return out, nil
	case len(raw) < journalHeaderSize:
		return out, corrupt("header cut short (%d of %d bytes) in a generation that is not the last", len(raw), journalHeaderSize)
	case end == 0 && last:
		out.dropped = fmt.Sprintf("header of zeros in a file of %d zero bytes", len(raw))
		return out, nil
	case end == 0:
		return out, corrupt("header of zeros in a generation that is not the last")
	}
	if string(raw[:8]) != journalMagic {
		return out, corrupt("no journal header (bad magic)")
	}
	switch v := binary.LittleEndian.Uint32(raw[8:]); {
	case v > journalVersion:
		return out, fmt.Errorf("store journal %s has format version %d; this csiactor knows versions up to %d: %w",
			jf.path, v, journalVersion, ErrSchemaTooNew)
	case v == 0:
		return out, corrupt("format version 0")
	}
	if crc32.Checksum(raw[:20], castagnoli) != binary.LittleEndian.Uint32(raw[20:]) {
		return out, corrupt("header checksum mismatch")
	}
	if gen := binary.LittleEndian.Uint64(raw[12:]); gen != jf.gen {
		return out, corrupt("header says generation %d, the file name %d", gen, jf.gen)
	}

	var (
		group      uint64 // group of the last good record; 0 before the first
		ended      = true // whether that record ended its group
		groupStart = 0    // index in out.records after the last record that ended a group
	)
	off := journalHeaderSize
	for off < end {
		r, n, err := decodeJournalRecord(raw[off:])
		if err != nil && !errors.Is(err, errBadFrame) {
			return out, corrupt("record at offset %d: %s", off, err.Error())
		}
		if err != nil {
			// The record that failed belongs to the group after the
			// last good one if that one ended its group, else to the
			// same group. A good record of any later group means this
			// group's write had finished (a group is appended only
			// after the one before it returned): damage, not a crash.
			torn := group
			if ended {
				torn = group + 1
			}
			if at, later, found := findLaterGroup(raw, off+1, end, torn); found {
				return out, corrupt("bad record at offset %d (%s) followed by a good record of group %d at offset %d",
					off, err.Error(), later, at)
			}
			if !last {
				return out, corrupt("bad record at offset %d (%s) at the end of a generation that is not the last", off, err.Error())
			}
			out.dropped = fmt.Sprintf("group %d torn at offset %d (%s): %d complete records of it and %d bytes dropped",
				torn, off, err.Error(), len(out.records)-groupStart, end-off)
			out.records = out.records[:groupStart]
			return out, nil
		}
		switch {
		case ended && r.group != group+1:
			return out, corrupt("record at offset %d starts group %d after group %d", off, r.group, group)
		case !ended && r.group != group:
			return out, corrupt("record at offset %d is of group %d inside group %d", off, r.group, group)
		}
		group, ended = r.group, r.flags&journalFlagEnd != 0
		out.records = append(out.records, r)
		if ended {
			groupStart = len(out.records)
		}
		off += n
	}
	if !ended {
		if !last {
			return out, corrupt("group %d has no end in a generation that is not the last", group)
		}
		out.dropped = fmt.Sprintf("group %d has no end: its %d records dropped", group, len(out.records)-groupStart)
		out.records = out.records[:groupStart]
	}
	return out, nil
}

// findLaterGroup looks at every offset from from up to end, where the
// file's zeros start (a record starts with a length that is not zero),
// for a good record of a group after torn, and returns its offset and
// group.
func findLaterGroup(raw []byte, from, end int, torn uint64) (int, uint64, bool) {
	for off := from; off < end && off+journalFrameSize+journalBodyFixed <= len(raw); off++ {
		r, _, err := decodeJournalRecord(raw[off:])
		if err == nil && r.group > torn {
			return off, r.group, true
		}
	}
	return 0, 0, false
}

// readJournalFile reads a journal file whole.
func readJournalFile(jf journalFile) ([]byte, error) {
	raw, err := os.ReadFile(jf.path)
	if err != nil {
		return nil, fmt.Errorf("read store journal: %w", err)
	}
	return raw, nil
}

// journalWritten reports whether a journal file's bytes hold anything
// after the header: a write began in its generation.
func journalWritten(raw []byte) bool {
	return len(raw) > journalHeaderSize && slices.ContainsFunc(raw[journalHeaderSize:], func(b byte) bool { return b != 0 })
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync data dir: %w", err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("sync data dir %s: %w", dir, err)
	}
	return nil
}
