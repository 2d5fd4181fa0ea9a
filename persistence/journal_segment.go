package persistence

import (
	"fmt"
	"os"
	"path/filepath"
)

// A journal generation's file is a segment: its header, then each group
// appended with one pwrite(2) at the end, so the file grows with each
// group. A checkpoint rotates the journal to the next generation's
// segment; the spare is that segment made ready ahead of the rotation, so
// that writers never wait for a file to be created. An append that fails
// is taken back by truncating the file to where it was.

// segment is one journal generation's file, open for appending.
type segment struct {
	f   *os.File
	gen uint64
	// size is the append offset: the header and every group appended.
	size int64
}

// close closes s's file, leaving it on disk.
func (s *segment) close() error { return s.f.Close() }

// remove closes s and removes its file.
func (s *segment) remove() error {
	cerr := s.close()
	if err := os.Remove(s.f.Name()); err != nil {
		return err
	}
	return cerr
}

// createSegment creates generation gen's file with its header. With sync,
// the file and its directory entry are on disk when it returns.
func (s *Store) createSegment(gen uint64) (*segment, error) {
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
	if !s.cfg.NoSync {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("sync store journal: %w", err))
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			return fail(err)
		}
	}
	return seg, nil
}

// takeSegment returns the segment of the next generation: the spare a
// checkpoint made ready, or a new one. The caller installs it.
func (s *Store) takeSegment() (*segment, error) {
	j := s.j
	j.rotMu.Lock()
	defer j.rotMu.Unlock()
	if sp := j.spare; sp != nil {
		j.spare = nil
		return sp, nil
	}
	seg, err := s.createSegment(j.lastGen + 1)
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
	seg, err := s.createSegment(j.lastGen + 1)
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
