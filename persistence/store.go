package persistence

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout this build reads and writes. A file with a
// newer version is refused with ErrSchemaTooNew; an older one is migrated
// by Open.
const SchemaVersion uint64 = 2

// Buckets and keys of schema version 2 (version 1 had no bucketSnapshots).
const (
	// bucketMeta holds keySchemaVersion.
	bucketMeta = "meta"
	// bucketAllocations maps allocation ID → JSON Allocation. Its bbolt
	// sequence is the allocation creation counter (Allocation.Seq).
	bucketAllocations = "allocations"
	// bucketVolumes maps volume ID → JSON Volume.
	bucketVolumes = "volumes"
	// bucketVolumesWithWork maps volume ID → empty value for every volume
	// whose record needs a volume actor at start-up (see Volume.hasWork).
	// It is written in the same transaction as the volume record.
	bucketVolumesWithWork = "volumes_with_work"
	// bucketSnapshots maps snapshot ID → JSON Snapshot (since version 2).
	bucketSnapshots = "snapshots"
	// keySchemaVersion is the schema version, 8 bytes big-endian.
	keySchemaVersion = "schema_version"
	// keyJournalApplied is the newest journal generation whose writes are
	// all in the file, 8 bytes big-endian, written by the checkpoint (or
	// replay) that applied it; absent until the first. Open skips journal
	// files of that generation or older.
	keyJournalApplied = "journal_applied"
	// keyBootID is the host's boot ID as the agent last recorded it (see
	// Store.BootID); absent until the first.
	keyBootID = "boot_id"
)

// schema is what Open expects of a file and how to get there from older
// versions. Open uses currentSchema; tests use others to exercise the
// migration hook.
type schema struct {
	version uint64
	// buckets must all exist in a file at this version.
	buckets []string
	// migrations[v] moves a file from version v to v+1. All steps from the
	// file's version up run in one transaction with the version bump, so a
	// crash leaves either the old or the new layout, never a mix.
	migrations map[uint64]func(tx *bolt.Tx) error
}

func currentSchema() schema {
	return schema{
		version: SchemaVersion,
		buckets: []string{bucketMeta, bucketAllocations, bucketVolumes, bucketVolumesWithWork, bucketSnapshots},
		// Open replays the journal after migrating, with this build's
		// layout: a migration that changes how volumes are stored must
		// say how journal records of the older layout are applied.
		migrations: map[uint64]func(tx *bolt.Tx) error{1: migrate1to2},
	}
}

// Store is csiactor's durable state in one bbolt file and its journal. Its
// methods are safe for concurrent use. Volume writes are appended to the
// journal, many in one append when they queue behind one (group commit),
// and moved into bbolt in batches by checkpoints; other writes are
// committed to bbolt one transaction at a time, many in one transaction
// when they queue behind a commit. Each write method returns when its
// write is on disk (or failed). Reads run concurrently with writes and
// with each other and see every write that has returned.
type Store struct {
	path string
	cfg  Config
	log  *logrus.Entry
	db   *bolt.DB
	m    *metrics
	// binaryVolumes is true when the binary volume codec covers the
	// record types as compiled; otherwise volumes are written as JSON.
	binaryVolumes bool
	// encodeCap is the buffer size encodeVolume starts with: the last
	// encoded size with some headroom, so that a record is encoded into
	// one allocation instead of growing one three times.
	encodeCap atomic.Int64

	// mu guards closed. A writer holds it for reading from its closed
	// check until its request is queued, or, when it commits the queue
	// itself, until that commit is done; so once Close has taken it for
	// writing, only the committer goroutine commits.
	mu     sync.RWMutex
	closed bool // guarded by mu

	// commits is the queue of bbolt writes and its group commit.
	commits groupCommit[*writeReq]
	// directVolumes makes PutVolume and DeleteVolume commit to bbolt as
	// other writes do, instead of appending to the journal: the store's
	// earlier behaviour, kept as the baseline of BenchmarkPutVolume and
	// BenchmarkPutVolumeLone. Tests and benchmarks change it only while
	// no write is in flight and nothing is journaled (setDirectVolumes).
	directVolumes bool

	// j is the journal of volume writes (journal.go).
	j *journal

	closeOnce sync.Once
	closeErr  error
}

// Open opens the store file at path, creating it (mode 0600, parent
// directories 0700) if it does not exist, replays its journal and starts
// the committers.
//
// Open fails, without writing to the file or its journal, with an error
// wrapping: ErrInUse if another process holds the file past
// cfg.LockTimeout (the journal is then not even read); ErrCorrupt if the
// file is not a readable csiactor store, or its journal is damaged
// anywhere but at its end, or journal files are next to a new file;
// ErrSchemaTooNew if a newer csiactor wrote the file or the journal;
// ErrInvalidConfig for a bad cfg. An existing file of an older schema is
// migrated in one transaction. An empty (0-byte) file, which a crash
// during the very first Open can leave, counts as new.
//
// The journal files are "<path>.journal.<generation>". Open applies every
// write they hold to the file in one transaction and removes them; a write
// cut short by a crash at the journal's end (it had not returned) is
// dropped with a log line.
//
// The caller must Close the store.
func Open(path string, cfg Config) (*Store, error) {
	return open(path, cfg, currentSchema())
}

func open(path string, cfg Config, sc schema) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, fmt.Errorf("store path is empty: %w", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", dir, err)
	}

	existing := false
	switch fi, err := os.Stat(path); {
	case err == nil && !fi.Mode().IsRegular():
		return nil, fmt.Errorf("store path %s is not a regular file: %w", path, ErrInvalidConfig)
	case err == nil:
		existing = fi.Size() > 0
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("stat store %s: %w", path, err)
	}

	// Journal files without a store file belong to one that is gone
	// (moved aside, say): replaying them into a new one would bring back
	// part of it. Refused before bbolt creates the file.
	if !existing {
		if err := refuseOrphanJournal(path); err != nil {
			return nil, err
		}
	}

	// bbolt may write while opening a file read-write (it rebuilds a
	// missing freelist, for one) and trusts the pages it finds. So an
	// existing file is first checked through a read-only handle, which
	// never writes; only a file that passes is opened for writing.
	if existing {
		if err := verifyFile(path, cfg, sc); err != nil {
			return nil, err
		}
	}

	db, err := openBolt(path, cfg, false)
	if err != nil {
		return nil, err
	}
	s := &Store{
		path: path,
		cfg:  cfg,
		log:  cfg.Logger.WithField("store", path),
		db:   db,
		j: &journal{
			cur:    map[string]overlayEntry{},
			ckKick: make(chan struct{}, 1),
			ckArm:  make(chan struct{}, 1),
			ckStop: make(chan struct{}),
			ckDone: make(chan struct{}),
		},

		binaryVolumes: volumeCodecCovers(),
	}
	s.commits.init(cfg.MaxBatchSize, s.commitLocked)
	s.j.appends.init(cfg.MaxBatchSize, s.appendLocked)
	if !s.binaryVolumes {
		s.log.Warn("volume record types differ from the binary codec (codec.go): writing volumes as JSON, which loads slower at start-up")
	}
	if err := s.initStore(sc); err != nil {
		_ = db.Close()
		return nil, err
	}
	s.m = newMetrics(func() float64 { return float64(s.commits.queued() + s.j.appends.queued()) })
	if err := s.m.register(cfg.Registerer); err != nil {
		_ = s.closeJournal(true) // nothing is journaled yet: removes the new file
		_ = db.Close()
		return nil, err
	}
	go s.commits.run()
	go s.j.appends.run()
	go s.runCheckpoints()
	s.log.WithField("schema_version", sc.version).Debug("store opened")
	return s, nil
}

// initStore brings the file, now locked, to sc and replays the journal
// into it; then it starts the journal's next generation. Everything that
// could refuse the file or the journal (ErrCorrupt, ErrSchemaTooNew) is
// checked before anything is written.
func (s *Store) initStore(sc schema) error {
	var state fileState
	var applied uint64
	err := s.view(context.Background(), func(tx *bolt.Tx) error {
		var err error
		if state, err = checkSchema(s.path, tx, sc); err != nil {
			return err
		}
		applied, err = journalApplied(s.path, tx)
		return err
	})
	if err != nil {
		return err
	}
	files, err := listJournals(s.path)
	if err != nil {
		return err
	}
	if state == stateEmpty && len(files) > 0 {
		return orphanJournalError(s.path, files)
	}
	rp, err := s.readJournals(files, applied)
	if err != nil {
		return err
	}
	if err := s.initSchema(sc, state); err != nil {
		return err
	}
	if err := s.replayJournals(rp); err != nil {
		return err
	}
	s.j.lastGen = rp.lastGen
	s.j.appends.lock()
	defer s.j.appends.unlock()
	seg, err := s.takeSegment()
	if err != nil {
		return fmt.Errorf("store %s: %w", s.path, err)
	}
	s.j.seg = seg
	return nil
}

// refuseOrphanJournal fails if journal files are next to the new store
// file at path.
func refuseOrphanJournal(path string) error {
	files, err := listJournals(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if len(files) > 0 {
		return orphanJournalError(path, files)
	}
	return nil
}

func orphanJournalError(path string, files []journalFile) error {
	return fmt.Errorf("store %s is new but %d journal file(s) of an earlier store are next to it (first %s): they belong to a store file that is gone; move them aside: %w",
		path, len(files), files[0].path, ErrCorrupt)
}

// Path returns the store file's path.
func (s *Store) Path() string { return s.path }

// Close waits for the commits under way, commits every write already
// queued, checkpoints the journal into the store file and removes it,
// stops the store's goroutines and closes the file. Writes that arrive
// after Close starts fail with ErrClosed, and so do reads after it
// returns. If the checkpoint fails, Close returns its error and leaves the
// journal for the next Open to replay. Close is idempotent: later calls
// return the first call's result.
func (s *Store) Close() error { return s.close(true) }

// close is Close; without checkpoint it leaves the journal files as a
// crash would (for tests).
func (s *Store) close(checkpoint bool) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.commits.shutdown()
		s.j.appends.shutdown()
		close(s.j.ckStop)
		<-s.j.ckDone
		var errs []error
		if err := s.closeJournal(checkpoint); err != nil {
			errs = append(errs, err)
		}
		s.m.unregister()
		if err := s.db.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("close store %s: %w", s.path, err)
		}
		s.log.Debug("store closed")
	})
	return s.closeErr
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// openBolt opens path with bbolt and turns its failures into our sentinels.
func openBolt(path string, cfg Config, readOnly bool) (*bolt.DB, error) {
	var file *os.File
	opts := &bolt.Options{
		Timeout:  cfg.LockTimeout,
		ReadOnly: readOnly,
		// Read the freelist in the read-only check too, so that a damaged
		// freelist page is found before the file is opened for writing.
		PreLoadFreelist: true,
		NoSync:          cfg.NoSync,
		FreelistType:    bolt.FreelistMapType,
		// Keep the file handle, so that a panic inside bolt.Open (a
		// damaged page) does not leave the file open and locked.
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	var db *bolt.DB
	panicked := false
	err := guard(path, func() error {
		panicked = true
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		panicked = false
		return err
	})
	switch {
	case err == nil:
		return db, nil
	case panicked:
		if file != nil {
			_ = file.Close()
		}
		return nil, err
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("data dir %s is in use by another csiactor agent: no lock on %s within %s: %w",
			filepath.Dir(path), path, cfg.LockTimeout, ErrInUse)
	case isOSError(err):
		return nil, fmt.Errorf("open store %s: %w", path, err)
	default:
		// bbolt's own complaints about the file's content: its sentinels
		// (ErrInvalid, ErrChecksum, ErrVersionMismatch, ...) and plain
		// errors such as "file size too small".
		return nil, fmt.Errorf("store %s: %w: %w", path, ErrCorrupt, err)
	}
}

// isOSError reports whether err comes from the operating system (open,
// lock, stat, mmap) rather than from bbolt reading the file's content.
func isOSError(err error) bool {
	var pathErr *fs.PathError
	var errno syscall.Errno
	return errors.As(err, &pathErr) || errors.As(err, &errno)
}

// guard runs fn with memory faults turned into panics and recovers any
// panic as an error wrapping ErrCorrupt. bbolt reads pages through an mmap:
// a truncated file faults (SIGBUS) and a damaged page makes bbolt panic.
func guard(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("store %s: reading a damaged page: %w: %w", path, ErrCorrupt, e)
				return
			}
			err = fmt.Errorf("store %s: reading a damaged page: %s: %w", path, fmt.Sprint(r), ErrCorrupt)
		}
	}()
	return fn()
}

// verifyFile checks an existing file through a read-only handle.
func verifyFile(path string, cfg Config, sc schema) error {
	db, err := openBolt(path, cfg, true)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	return guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			fi, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("stat store %s: %w", path, err)
			}
			if tx.Size() > fi.Size() {
				return fmt.Errorf("store %s is %d bytes but its meta page says %d (truncated): %w",
					path, fi.Size(), tx.Size(), ErrCorrupt)
			}
			if _, err := checkSchema(path, tx, sc); err != nil {
				return err
			}
			if cfg.VerifyOnOpen {
				return checkPages(path, tx)
			}
			return nil
		})
	})
}

// checkPages runs bbolt's page-level consistency check.
func checkPages(path string, tx *bolt.Tx) error {
	var first error
	n := 0
	// Drain the channel: its producer goroutine stops only at the end.
	for err := range tx.Check() {
		n++
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return fmt.Errorf("store %s: consistency check found %d problem(s), first: %w: %w", path, n, ErrCorrupt, first)
	}
	return nil
}

// fileState is what checkSchema found.
type fileState int

const (
	stateCurrent fileState = iota // at sc.version with every bucket
	stateEmpty                    // no buckets at all: a new file
	stateOlder                    // an older version with a migration path
)

// checkSchema classifies the file as of tx, or fails with ErrCorrupt or
// ErrSchemaTooNew.
func checkSchema(path string, tx *bolt.Tx, sc schema) (fileState, error) {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		if k, _ := tx.Cursor().First(); k == nil {
			return stateEmpty, nil
		}
		return 0, fmt.Errorf("store %s has no %q bucket, so it is not a csiactor store: %w", path, bucketMeta, ErrCorrupt)
	}
	raw := meta.Get([]byte(keySchemaVersion))
	if len(raw) != 8 {
		return 0, fmt.Errorf("store %s: schema version is %d bytes, want 8: %w", path, len(raw), ErrCorrupt)
	}
	v := binary.BigEndian.Uint64(raw)
	switch {
	case v == 0:
		return 0, fmt.Errorf("store %s: schema version 0: %w", path, ErrCorrupt)
	case v > sc.version:
		return 0, fmt.Errorf("store %s has schema version %d; this csiactor knows versions up to %d: %w",
			path, v, sc.version, ErrSchemaTooNew)
	case v < sc.version:
		for from := v; from < sc.version; from++ {
			if sc.migrations[from] == nil {
				return 0, fmt.Errorf("store %s: no migration from schema version %d to %d: %w", path, from, from+1, ErrCorrupt)
			}
		}
		return stateOlder, nil
	}
	for _, name := range sc.buckets {
		if tx.Bucket([]byte(name)) == nil {
			return 0, fmt.Errorf("store %s: bucket %q is missing: %w", path, name, ErrCorrupt)
		}
	}
	return stateCurrent, nil
}

// initSchema creates the buckets of a new file or migrates an older one,
// as checkSchema found it in state. A file already at the current version
// is not written.
func (s *Store) initSchema(sc schema, state fileState) error {
	if state == stateCurrent {
		return nil
	}
	return s.update(func(tx *bolt.Tx) error {
		switch state {
		case stateEmpty:
			for _, name := range sc.buckets {
				if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
					return fmt.Errorf("store %s: create bucket %q: %w", s.path, name, err)
				}
			}
			s.log.WithField("schema_version", sc.version).Info("created new store")
		case stateOlder:
			from := binary.BigEndian.Uint64(tx.Bucket([]byte(bucketMeta)).Get([]byte(keySchemaVersion)))
			for v := from; v < sc.version; v++ {
				if err := sc.migrations[v](tx); err != nil {
					return fmt.Errorf("store %s: migrate schema version %d to %d: %w", s.path, v, v+1, err)
				}
			}
			s.log.WithField("from", from).WithField("to", sc.version).Info("migrated store schema")
		}
		var raw [8]byte
		binary.BigEndian.PutUint64(raw[:], sc.version)
		return tx.Bucket([]byte(bucketMeta)).Put([]byte(keySchemaVersion), raw[:])
	})
}

// view runs fn in a read transaction, guarded against damaged pages.
func (s *Store) view(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return ErrClosed
	}
	err := guard(s.path, func() error { return s.db.View(fn) })
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// update runs fn in one read-write transaction, guarded against damaged
// pages. Only commitLocked (with commits.mu held), checkpoints (with the
// journal's ckMu held) and Open call it; bbolt runs one at a time.
func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	return guard(s.path, func() error { return s.db.Update(fn) })
}
