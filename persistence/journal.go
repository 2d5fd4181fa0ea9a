package persistence

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Volume writes (PutVolume, DeleteVolume) go to a write-ahead journal next
// to the bbolt file instead of a bbolt transaction each: one framed record
// per write, appended with pwrite(2) to the generation's file
// (journal_segment.go), many writes in one append and one fdatasync when
// they queue behind each other (group commit: see
// groupcommit.go). An in-memory overlay holds the writes not yet in bbolt,
// so reads see every write that returned, and the deferred writes
// (PutVolumeDeferred), which are never appended. Checkpoints move the overlay into
// bbolt in one transaction: the journal is rotated to a new generation
// with a fresh overlay first, so writers wait only for the rotation, never
// for bbolt. Open replays what a crash left. journal_format.go has the
// file format.

// maxKeptJournalBuf is the largest append buffer kept for the next group.
const maxKeptJournalBuf = 1 << 20

// overlayEntry is the latest journaled write of one volume.
type overlayEntry struct {
	// value is the encoded volume; nil for a delete.
	value []byte
	// active is Volume.Active of a put, for the volumes_with_work index.
	active bool
}

// journal is the write-ahead journal of volume writes and its overlay.
type journal struct {
	// appends is the queue of volume writes and its group commit. Its mu
	// is held by whoever appends a group (a writer, or the journal
	// committer goroutine) and by a checkpoint swapping segments.
	appends  groupCommit[*journalReq]
	seg      *segment // current generation's segment; nil after Close's checkpoint; guarded by appends.mu
	curBytes int64    // bytes of records appended to seg; guarded by appends.mu
	group    uint64   // seg's last group; guarded by appends.mu
	buf      []byte   // reusable append buffer; guarded by appends.mu
	broken   error    // set when a failed append could not be undone; guarded by appends.mu

	// rotMu guards the making of segments: which generation is next, and
	// a spare made ready ahead of a rotation. Taken after appends.mu.
	rotMu   sync.Mutex
	lastGen uint64   // the newest generation made; guarded by rotMu
	spare   *segment // generation lastGen, made and not yet installed; guarded by rotMu

	// ovMu guards the overlays. cur is replaced (by a checkpoint) with
	// appends.mu held too, and flushing with ckMu held too, so that either
	// lock alone keeps its map; cur's entries change under ovMu alone
	// (deferred writes hold no other lock).
	ovMu sync.RWMutex
	// cur holds the writes of the current generations (seg and full).
	cur map[string]overlayEntry
	// flushing holds the writes of the generations being checkpointed (or
	// whose checkpoint failed); nil when none is.
	flushing map[string]overlayEntry

	// ckMu is held for a whole checkpoint.
	ckMu     sync.Mutex
	flushSeg *segment // flushing's segment; guarded by ckMu
	closed   bool     // no checkpoint after Close; guarded by ckMu

	ckKick chan struct{} // the journal passed Config.CheckpointBytes, or refuses writes
	ckArm  chan struct{} // the first write of a generation
	ckStop chan struct{}
	ckDone chan struct{}
}

// journalReq is one caller's volume write, queued for the next append.
type journalReq struct {
	// replySlot's err set means the request was taken out of its group
	// (its ctx ended).
	replySlot
	ctx    context.Context
	op     byte
	active bool
	id     string
	value  []byte
	// puts, when not nil, makes the request PutVolumes': these volume
	// puts, in one group with the rest of the append (op, id and value
	// are unused then).
	puts []journalPut
}

// journalPut is one volume put of a PutVolumes request.
type journalPut struct {
	id     string
	value  []byte
	active bool
}

// journalWrite appends one volume write to the journal and waits until it
// is durable (written, and with sync on, fdatasync'd) and in the overlay.
// It follows Store.write: groupCommit.submit appends it, by the caller
// itself when no append is running. A ctx that ends while the write is
// queued skips it; one that ends later leaves it to be appended or not.
func (s *Store) journalWrite(ctx context.Context, op byte, id string, value []byte, active bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if n := journalBodyFixed + len(id) + len(value); n > journalMaxBody {
		return fmt.Errorf("volume %q is %d bytes encoded, more than %d: %w", id, n, journalMaxBody, ErrInvalid)
	}
	r := &journalReq{replySlot: replySlot{done: make(chan error, 1)}, ctx: ctx, op: op, id: id, value: value, active: active}
	return s.j.appends.submit(ctx, s, r)
}

// deferWrite puts a volume write in the current overlay without
// appending it to the journal (PutVolumeDeferred): reads see it at once,
// and the checkpoint that the write arms moves it into bbolt with the
// rest of the overlay.
func (s *Store) deferWrite(id string, value []byte, active bool) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	j := s.j
	j.ovMu.Lock()
	j.cur[id] = overlayEntry{value: value, active: active}
	j.ovMu.Unlock()
	s.m.writesDeferred.Inc()
	kick(j.ckArm)
	return nil
}

// appendLocked appends the first queued write and those queued behind it,
// up to MaxBatchSize, as one group: one pwrite(2), and with sync on, one
// fdatasync. Then it puts
// them in the overlay, in queue order (the order replay applies them in),
// and answers each. It reports false when the queue was empty. The caller
// holds appends.mu.
func (s *Store) appendLocked() bool {
	j := s.j
	batch, ok := j.appends.startLocked()
	if !ok {
		return false
	}
	start := time.Now()
gather:
	for len(batch) < s.cfg.MaxBatchSize {
		select {
		case r := <-j.appends.reqs:
			batch = append(batch, r)
		default:
			break gather
		}
	}
	last := -1
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = fmt.Errorf("store write not applied: %w", err)
			continue
		}
		last = i
	}
	var err error
	wasEmpty := j.curBytes == 0
	if last >= 0 {
		err = s.appendGroupLocked(batch[:last+1])
	}
	elapsed := time.Since(start)
	if err == nil && last >= 0 {
		j.ovMu.Lock()
		for _, r := range batch[:last+1] {
			if r.err == nil && r.puts != nil {
				for _, p := range r.puts {
					j.cur[p.id] = overlayEntry{value: p.value, active: p.active}
				}
				continue
			}
			if r.err == nil {
				e := overlayEntry{active: r.active}
				if r.op == journalOpPut {
					e.value = r.value
				}
				j.cur[r.id] = e
			}
		}
		j.ovMu.Unlock()
	}
	if err != nil {
		s.log.WithField("writes", last+1).WithError(err).Error("store journal append failed")
	}
	if applied := settleLocked(s, batch, elapsed, err); applied > 0 {
		if wasEmpty {
			kick(j.ckArm)
		}
		if journalHeaderSize+j.curBytes >= s.cfg.CheckpointBytes {
			kick(j.ckKick)
		}
	}
	j.appends.endLocked(batch)
	return true
}

// appendGroupLocked writes the records of batch (skipping those whose err
// is set) as the next group, in the current segment or, when they do not
// fit there, in the next generation's. On failure it takes the group back
// out of the file, so that replay never applies a write that failed; if
// that fails too, the journal refuses appends until a checkpoint replaces
// its segment. The caller holds appends.mu.
func (s *Store) appendGroupLocked(batch []*journalReq) error {
	j := s.j
	if j.broken != nil {
		return j.broken
	}
	seg := j.seg
	group := j.group + 1
	buf := appendGroup(j.buf[:0], batch, group)
	if cap(buf) <= maxKeptJournalBuf {
		j.buf = buf[:0]
	} else {
		j.buf = nil
	}
	n, err := seg.f.WriteAt(buf, seg.size)
	if err == nil && !s.cfg.NoSync {
		err = fdatasync(seg.f)
	}
	if err == nil {
		seg.size += int64(n)
		j.curBytes += int64(n)
		j.group = group
		return nil
	}
	undo := seg.f.Truncate(seg.size)
	if undo == nil && !s.cfg.NoSync {
		undo = fdatasync(seg.f)
	}
	if undo != nil {
		j.broken = fmt.Errorf("store journal refuses writes until the next checkpoint: a failed append could not be taken back: %w", undo)
		kick(j.ckKick)
	}
	return err
}

// appendGroup appends the records of batch (skipping those whose err is
// set) to dst as group; the last one ends it.
func appendGroup(dst []byte, batch []*journalReq, group uint64) []byte {
	for i, r := range batch {
		if r.err != nil {
			continue
		}
		if r.puts != nil {
			for k, p := range r.puts {
				flags := journalFlags(p.active, i == len(batch)-1 && k == len(r.puts)-1)
				dst = appendJournalRecord(dst, journalOpPut, flags, group, p.id, p.value)
			}
			continue
		}
		dst = appendJournalRecord(dst, r.op, journalFlags(r.active, i == len(batch)-1), group, r.id, r.value)
	}
	return dst
}

// journalFlags returns the flags of a record: journalFlagActive for an
// active volume's put, journalFlagEnd for the last record of its group.
func journalFlags(active, last bool) byte {
	var flags byte
	if active {
		flags |= journalFlagActive
	}
	if last {
		flags |= journalFlagEnd
	}
	return flags
}

// lookup returns the latest journaled write of id not yet checkpointed:
// from the current generation, else from the one being checkpointed.
func (j *journal) lookup(id string) (overlayEntry, bool) {
	j.ovMu.RLock()
	defer j.ovMu.RUnlock()
	if e, ok := j.cur[id]; ok {
		return e, true
	}
	e, ok := j.flushing[id]
	return e, ok
}

// pending reports whether any journaled write is not yet in bbolt.
func (j *journal) pending() bool {
	j.ovMu.RLock()
	defer j.ovMu.RUnlock()
	return len(j.cur) > 0 || j.flushing != nil
}

// runCheckpoints is the checkpointer goroutine. It checkpoints when the
// journal passes Config.CheckpointBytes, and Config.CheckpointDelay after
// the first write of a generation. After a failed checkpoint it waits
// CheckpointDelay before the next try.
func (s *Store) runCheckpoints() {
	j := s.j
	defer close(j.ckDone)
	timer := time.NewTimer(s.cfg.CheckpointDelay)
	timer.Stop()
	armed := false
	var failedAt time.Time
	for {
		select {
		case <-j.ckArm:
			if !armed {
				timer.Reset(s.cfg.CheckpointDelay)
				armed = true
			}
			continue
		case <-j.ckKick:
			if !failedAt.IsZero() && time.Since(failedAt) < s.cfg.CheckpointDelay {
				continue // the timer retries
			}
		case <-timer.C:
			armed = false
		case <-j.ckStop:
			timer.Stop()
			return
		}
		if err := s.checkpoint(); err != nil && !errors.Is(err, ErrClosed) {
			s.log.WithError(err).Error("store checkpoint failed; journaled writes stay in the journal and are retried")
			failedAt = time.Now()
			timer.Reset(s.cfg.CheckpointDelay)
			armed = true
		} else {
			failedAt = time.Time{}
		}
	}
}

// checkpoint moves every journaled write into bbolt.
func (s *Store) checkpoint() error {
	s.j.ckMu.Lock()
	defer s.j.ckMu.Unlock()
	return s.checkpointLocked(false)
}

// checkpointLocked flushes the generations left by a failed checkpoint,
// if any, then rotates the current generations out and flushes them.
// Writers wait only for the rotation (a pointer swap under appends.mu; the
// next segment is made before). final is Close's last checkpoint: no
// writer is left, so the current generations are flushed without a new
// segment. The caller holds ckMu.
func (s *Store) checkpointLocked(final bool) error {
	j := s.j
	if j.closed {
		return ErrClosed
	}
	if j.flushing != nil {
		if err := s.flushLocked(); err != nil {
			return err
		}
	}
	j.appends.lock()
	j.ovMu.RLock() // deferred writes change cur under ovMu alone
	need := len(j.cur) > 0 || j.broken != nil
	j.ovMu.RUnlock()
	j.appends.unlock()
	if !need {
		return nil
	}
	if !final {
		if err := s.prepareSpare(); err != nil {
			return fmt.Errorf("checkpoint store: rotate journal: %w", err)
		}
	}
	fresh := make(map[string]overlayEntry)
	j.appends.lock()
	var next *segment
	if !final {
		var err error
		if next, err = s.takeSegment(); err != nil {
			j.appends.unlock()
			return fmt.Errorf("checkpoint store: rotate journal: %w", err)
		}
	}
	j.flushSeg = j.seg
	j.seg, j.curBytes, j.group, j.broken = next, 0, 0, nil
	j.ovMu.Lock()
	j.flushing, j.cur = j.cur, fresh
	j.ovMu.Unlock()
	j.appends.unlock()
	return s.flushLocked()
}

// flushLocked applies the flushing overlay to bbolt in one transaction
// (synced unless NoSync), which also records its newest generation as
// applied, and then drops the overlay and removes the generations' files.
// On failure both stay, and reads keep finding the writes in the overlay.
// The caller holds ckMu.
func (s *Store) flushLocked() error {
	j := s.j
	start := time.Now()
	ids := slices.Sorted(maps.Keys(j.flushing))
	err := s.update(func(tx *bolt.Tx) error {
		for _, id := range ids {
			if err := applyVolumeEntry(tx, id, j.flushing[id]); err != nil {
				return err
			}
		}
		return setJournalApplied(tx, j.flushSeg.gen)
	})
	s.m.checkpointSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		s.m.checkpointsError.Inc()
		return fmt.Errorf("checkpoint store %s: %w", s.path, err)
	}
	s.m.checkpointsOK.Inc()
	j.ovMu.Lock()
	j.flushing = nil
	j.ovMu.Unlock()
	// A file whose removal is lost is skipped at Open: its generation is
	// recorded as applied.
	if err := j.flushSeg.remove(); err != nil {
		s.log.WithError(err).Warn("cannot remove a checkpointed store journal file; Open skips it")
	}
	j.flushSeg = nil
	return nil
}

// closeJournal ends the journal for Close. With checkpoint, every
// journaled write is moved into bbolt and the journal files are removed;
// if that fails (or without checkpoint, which tests use to leave the files
// as a crash would), they stay for the next Open to replay. The journal
// committer and checkpointer have stopped.
func (s *Store) closeJournal(checkpoint bool) error {
	j := s.j
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	var err error
	if checkpoint {
		err = s.checkpointLocked(true)
	}
	j.closed = true
	s.dropSpare()
	j.appends.lock()
	defer j.appends.unlock()
	if j.flushSeg != nil {
		_ = j.flushSeg.close()
		j.flushSeg = nil
	}
	if seg := j.seg; seg != nil {
		j.seg = nil
		if checkpoint && err == nil {
			// Its generation holds nothing: every write is in bbolt.
			if rerr := seg.remove(); rerr != nil {
				s.log.WithError(rerr).Warn("cannot remove the empty store journal file")
			}
		} else {
			_ = seg.close()
		}
	}
	return err
}

// applyVolumeEntry writes one volume's latest journaled write into tx.
func applyVolumeEntry(tx *bolt.Tx, id string, e overlayEntry) error {
	if e.value == nil {
		return deleteVolumeTx(tx, id, []byte(id))
	}
	return putVolumeTx(tx, id, []byte(id), e.value, e.active)
}

// putVolumeTx stores an encoded volume and keeps the index of active
// volumes, touching the index only when the volume's entry changes: a Put
// of an entry already there still rewrites its page (and the pages above
// it) on commit. Delete of a missing key writes nothing.
func putVolumeTx(tx *bolt.Tx, id string, key, data []byte, active bool) error {
	if err := tx.Bucket([]byte(bucketVolumes)).Put(key, data); err != nil {
		return fmt.Errorf("put volume %q: %w", id, err)
	}
	idx := tx.Bucket([]byte(bucketVolumesWithWork))
	var err error
	switch indexed := idx.Get(key) != nil; {
	case active && !indexed:
		err = idx.Put(key, []byte{})
	case !active && indexed:
		err = idx.Delete(key)
	}
	if err != nil {
		return fmt.Errorf("index volume %q: %w", id, err)
	}
	return nil
}

// deleteVolumeTx removes a volume and its index entry.
func deleteVolumeTx(tx *bolt.Tx, id string, key []byte) error {
	if err := tx.Bucket([]byte(bucketVolumes)).Delete(key); err != nil {
		return fmt.Errorf("delete volume %q: %w", id, err)
	}
	if err := tx.Bucket([]byte(bucketVolumesWithWork)).Delete(key); err != nil {
		return fmt.Errorf("unindex volume %q: %w", id, err)
	}
	return nil
}

// journalApplied returns the last journal generation recorded as applied
// to the file, 0 if none is.
func journalApplied(path string, tx *bolt.Tx) (uint64, error) {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		return 0, nil
	}
	raw := meta.Get([]byte(keyJournalApplied))
	switch len(raw) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(raw), nil
	}
	return 0, fmt.Errorf("store %s: applied journal generation is %d bytes, want 8: %w", path, len(raw), ErrCorrupt)
}

func setJournalApplied(tx *bolt.Tx, gen uint64) error {
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], gen)
	if err := tx.Bucket([]byte(bucketMeta)).Put([]byte(keyJournalApplied), raw[:]); err != nil {
		return fmt.Errorf("record applied journal generation: %w", err)
	}
	return nil
}

// journalReplay is what Open found in the journal files.
type journalReplay struct {
	// files are every journal file found, removed once replayed.
	files []journalFile
	// entries is the last write per volume in the generations not yet
	// applied, in the order they were written.
	entries map[string]overlayEntry
	records int
	// lastGen is the newest generation found or recorded as applied.
	lastGen uint64
}

// readJournals reads and checks every journal generation after applied
// without writing anything. A generation may end unfinished (a crash
// during an append) only if no later one holds a write: its unfinished
// last group is dropped with a log line.
func (s *Store) readJournals(files []journalFile, applied uint64) (journalReplay, error) {
	rp := journalReplay{files: files, entries: map[string]overlayEntry{}, lastGen: applied}
	var todo []journalFile
	var raws [][]byte
	for _, jf := range files {
		rp.lastGen = max(rp.lastGen, jf.gen)
		if jf.gen <= applied {
			continue // its checkpoint finished; the file's removal was lost
		}
		raw, err := readJournalFile(jf)
		if err != nil {
			return rp, err
		}
		todo, raws = append(todo, jf), append(raws, raw)
	}
	contents := make([]journalContent, len(todo))
	laterWritten := false
	for i := len(todo) - 1; i >= 0; i-- {
		c, err := parseJournal(todo[i], raws[i], !laterWritten)
		if err != nil {
			return rp, err
		}
		if c.dropped != "" {
			s.log.WithField("journal", todo[i].path).Warn("store journal ends in a write cut short by a crash (it had not returned); dropped: " + c.dropped)
		}
		contents[i] = c
		laterWritten = laterWritten || journalWritten(raws[i])
	}
	for _, c := range contents {
		for _, r := range c.records {
			e := overlayEntry{active: r.flags&journalFlagActive != 0}
			if r.op == journalOpPut {
				e.value = r.value
			}
			rp.entries[string(r.id)] = e
			rp.records++
		}
	}
	return rp, nil
}

// replayJournals applies what readJournals found to bbolt in one
// transaction (synced unless NoSync), recording the newest generation as
// applied, and removes the journal files.
func (s *Store) replayJournals(rp journalReplay) error {
	if len(rp.files) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(rp.entries))
	err := s.update(func(tx *bolt.Tx) error {
		for _, id := range ids {
			if err := applyVolumeEntry(tx, id, rp.entries[id]); err != nil {
				return err
			}
		}
		return setJournalApplied(tx, rp.lastGen)
	})
	if err != nil {
		return fmt.Errorf("store %s: replay journal: %w", s.path, err)
	}
	for _, jf := range rp.files {
		if err := os.Remove(jf.path); err != nil {
			s.log.WithError(err).Warn("cannot remove a replayed store journal file; the next Open skips it")
		}
	}
	if rp.records > 0 {
		s.log.WithField("records", rp.records).WithField("volumes", len(rp.entries)).WithField("files", len(rp.files)).
			Info("replayed store journal")
	}
	return nil
}
