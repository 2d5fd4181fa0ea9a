package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
)

// A journal generation's file is a segment. On Linux it is preallocated
// to a fixed size (fallocate), so that appends never change its size (an
// fdatasync commits no size change; the file system still records which
// preallocated blocks now hold data) and a full disk fails when a segment
// is made, not on a later write. The part of the file not yet appended to is
// zeros: the end of the journal, for replay as for the append offset.
// When a group does not fit in what is left, the writer that appends it
// starts the next generation (a full rotation): the current overlay then
// spans several segments, all moved into bbolt by the next checkpoint. A
// group bigger than a segment gets a segment sized to fit it.
//
// With sync off, a preallocated segment is also mapped MAP_SHARED and a
// group is appended by encoding its records straight into the mapping,
// which is the page cache: a write survives a crash of the process
// without a syscall. With sync on, it is appended with one pwrite(2) and
// fdatasync'd: measured, that beats the mapping there (each fdatasync
// writes the pages back and write-protects them, so every group then
// takes a write fault per page, and the writeback walks the mappings);
// against the fdatasync, the syscall saved by the mapping is small.
// segmentKind forces either way, for benchmarks.
//
// Elsewhere (and where the file system cannot preallocate), a segment is
// plain: a file appended with pwrite(2) that grows with each group, as the
// journal was first written; it is never full. segmentPlain makes every
// new segment plain, the baseline of the benchmarks.
//
// Nothing truncates a preallocated file: an append that fails is taken
// back by zeroing its bytes, and a segment is unmapped before its file is
// closed or removed. A write to a mapping that faults anyway (another program
// truncated the file) becomes an error, not a SIGBUS.

// Segment sizes.
const (
	// minSegmentBytes and maxSegmentBytes bound the size of a new segment,
	// twice Config.CheckpointBytes otherwise, so that the checkpoint
	// started at CheckpointBytes normally rotates the journal before its
	// generation is full.
	minSegmentBytes = 16 << 10
	maxSegmentBytes = 8 << 20
	// maxMappedBytes is the largest segment mapped; a group bigger than
	// that (only possible with MaxBatchSize huge volumes) gets a segment
	// appended with pwrite.
	maxMappedBytes = 1 << 30
	// prefaultBytes is how far ahead of the append offset the pages of a
	// mapped segment are read into the page cache and mapped (off the
	// writers' path), so that an append takes at most a cheap write fault
	// instead of allocating and zeroing a page of the file.
	prefaultBytes = 256 << 10
	// pageBytes rounds segment sizes.
	pageBytes = 4096
)

// segmentKind is how new segments are made and appended to.
type segmentKind int

const (
	// segmentAuto: preallocated, and mapped when Config.NoSync is set.
	segmentAuto segmentKind = iota
	// segmentPlain: not preallocated, appended with pwrite, as the journal
	// was first written.
	segmentPlain
	// segmentMapped: preallocated and mapped, also with sync on.
	segmentMapped
	// segmentPwrite: preallocated and appended with pwrite, also with
	// sync off.
	segmentPwrite
)

// segmentBytes returns the size of a new segment for cfg.
func segmentBytes(cfg Config) int64 {
	return roundUp(min(max(2*cfg.CheckpointBytes, minSegmentBytes), maxSegmentBytes), pageBytes)
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// segment is one journal generation's file, open for appending.
type segment struct {
	f   *os.File
	gen uint64
	// prealloc is the file's preallocated size, 0 for a plain segment.
	prealloc int64
	// data is the file mapped MAP_SHARED, prealloc bytes; nil when the
	// segment is appended with pwrite.
	data []byte
	// size is the append offset: the header and every group appended.
	size int64
	// populated is how much of data has been prefaulted; prefaulting is
	// set while a prefault of more is asked for and not done. Both
	// guarded by journal.appends.mu.
	populated   int64
	prefaulting bool
}

// fits reports whether a group of n bytes fits in s.
func (s *segment) fits(n int64) bool {
	return s.prealloc == 0 || s.size+n <= s.prealloc
}

// close unmaps s and closes its file, leaving the file on disk.
func (s *segment) close() error {
	var errs []error
	if s.data != nil {
		if err := unmapFile(s.data); err != nil {
			errs = append(errs, fmt.Errorf("unmap store journal %s: %w", s.f.Name(), err))
		}
		s.data = nil
	}
	if err := s.f.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove closes s and removes its file.
func (s *segment) remove() error {
	cerr := s.close()
	if err := os.Remove(s.f.Name()); err != nil {
		return err
	}
	return cerr
}

// createSegment creates generation gen's file with its header, of kind,
// preallocated big enough for a group of minBytes unless plain. With
// sync, the file (its header and size) and its directory entry are on
// disk when it returns. A full disk fails here, not when a write would
// have to allocate a block.
func (s *Store) createSegment(gen uint64, minBytes int64, kind segmentKind) (*segment, error) {
	path := journalName(s.path, gen)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create store journal: %w", err)
	}
	seg := &segment{f: f, gen: gen, size: journalHeaderSize}
	fail := func(err error) (*segment, error) {
		_ = seg.close()
		_ = os.Remove(path)
		return nil, err
	}
	if _, err := f.WriteAt(appendJournalHeader(make([]byte, 0, journalHeaderSize), gen), 0); err != nil {
		return fail(fmt.Errorf("write store journal header: %w", err))
	}
	if kind != segmentPlain && mmapJournal {
		n := max(s.j.segBytes, roundUp(journalHeaderSize+minBytes, pageBytes))
		switch err := preallocate(f, n); {
		case errors.Is(err, errNoPreallocate):
			s.warnPlainLocked(err)
		case err != nil:
			return fail(fmt.Errorf("preallocate store journal: %w", err))
		default:
			seg.prealloc = n
		}
		mapped := kind == segmentMapped || (kind == segmentAuto && s.cfg.NoSync)
		if mapped && seg.prealloc > 0 && n <= maxMappedBytes {
			data, err := mapFile(f, n)
			if err != nil {
				s.warnPlainLocked(err)
			} else {
				seg.data = data
			}
		}
	}
	if !s.cfg.NoSync {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("sync store journal: %w", err))
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			return fail(err)
		}
	}
	if seg.data != nil {
		seg.populated = min(int64(len(seg.data)), prefaultBytes)
		populate(seg.data[:seg.populated])
	}
	return seg, nil
}

// warnPlainLocked logs, once per store, that journal files are not mapped.
// The caller holds rotMu.
func (s *Store) warnPlainLocked(err error) {
	if s.j.warnedPlain {
		return
	}
	s.j.warnedPlain = true
	s.log.WithError(err).Warn("store journal files cannot be preallocated or mapped here; appending with write(2), which costs a syscall per write")
}

// takeSegmentLocked returns the segment of the next generation, big
// enough for a group of minBytes: the spare a checkpoint made ready, or a
// new one. The caller holds appends.mu, and installs it.
func (s *Store) takeSegmentLocked(minBytes int64) (*segment, error) {
	j := s.j
	j.rotMu.Lock()
	defer j.rotMu.Unlock()
	if sp := j.spare; sp != nil {
		j.spare = nil
		if sp.fits(minBytes) {
			return sp, nil
		}
		// Too small for this group: its generation gets a bigger file.
		if err := sp.remove(); err != nil {
			s.log.WithError(err).Warn("cannot remove an unused store journal file; Open skips it")
		}
		j.lastGen = sp.gen - 1
	}
	seg, err := s.createSegment(j.lastGen+1, minBytes, s.segmentKind)
	if err != nil {
		return nil, err
	}
	j.lastGen++
	return seg, nil
}

// prepareSpare makes the next generation's segment ready, so that a
// rotation under appends.mu need not create it. The caller does not hold
// appends.mu.
func (s *Store) prepareSpare() error {
	j := s.j
	j.rotMu.Lock()
	defer j.rotMu.Unlock()
	if j.spare != nil {
		return nil
	}
	seg, err := s.createSegment(j.lastGen+1, 0, s.segmentKind)
	if err != nil {
		return err
	}
	j.spare = seg
	j.lastGen++
	return nil
}

// dropSpare removes the spare segment, if any.
func (s *Store) dropSpare() {
	j := s.j
	j.rotMu.Lock()
	defer j.rotMu.Unlock()
	if j.spare != nil {
		if err := j.spare.remove(); err != nil {
			s.log.WithError(err).Warn("cannot remove an unused store journal file; Open skips it")
		}
		j.spare = nil
	}
}

// prefault maps the pages of the current segment up to prefaultBytes
// ahead of its append offset, for the checkpointer goroutine. It holds
// ckMu, under which alone a segment is unmapped, while it reads the pages
// in without appends.mu: appends go on meanwhile.
func (s *Store) prefault() {
	j := s.j
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	if j.closed {
		return
	}
	j.appends.lock()
	seg := j.seg
	var lo, hi int64
	if seg != nil && seg.data != nil {
		lo, hi = seg.populated, min(int64(len(seg.data)), seg.size+prefaultBytes)
	}
	j.appends.unlock()
	if hi > lo {
		populate(seg.data[lo:hi])
	}
	if seg != nil {
		j.appends.lock()
		seg.populated = max(seg.populated, hi)
		seg.prefaulting = false
		j.appends.unlock()
	}
}

// encodeMapped encodes the group into at, a part of a mapping exactly its
// size, and clearMapped zeroes at; both turn memory faults into an error:
// a write past the end of a file that another program truncated faults
// (SIGBUS) instead of failing.
func encodeMapped(at []byte, batch []*journalReq, group uint64) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverFault(&err)
	if got := appendGroup(at[:0], batch, group); len(got) != len(at) || &got[0] != &at[0] {
		panic("persistence: a journal group's size is not what was reserved for it")
	}
	return nil
}

func clearMapped(at []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverFault(&err)
	clear(at)
	return nil
}

// recoverFault, deferred, turns a panic of a memory fault into *err and
// lets any other panic go on.
func recoverFault(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if _, fault := r.(interface{ Addr() uintptr }); !fault {
		panic(r)
	}
	if e, ok := r.(error); ok {
		*err = fmt.Errorf("write to the mapped store journal faulted (its file was truncated?): %w", e)
		return
	}
	*err = fmt.Errorf("write to the mapped store journal faulted (its file was truncated?): %s", fmt.Sprint(r))
}
