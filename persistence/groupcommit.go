package persistence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// groupCommit is the group commit of one write queue: bbolt transactions
// (commit.go) and journal appends (journal.go) each have one.
//
// A caller queues its write, wakes the queue's committer goroutine (run)
// and waits for its answer. The committer commits every write queued, as
// many per batch as MaxBatchSize allows, and answers each: the writes
// that queue while one batch is being synced form the next batch. Who
// else holds mu (a checkpoint swapping segments) releases it through
// unlock, which wakes the committer when writes are queued.
type groupCommit[R request] struct {
	// reqs is the queue of writes not yet taken into a batch.
	reqs chan R
	// mu is held by run while it takes writes from reqs and commits
	// them. Its user may hold it for more (the journal, to swap
	// segments); it releases it through unlock all the same.
	mu sync.Mutex
	// batch is the reusable slice of the batch being built; guarded by mu.
	batch []R
	// commitLocked commits the first queued write and those queued behind
	// it as one batch, and answers each of them. It reports false when the
	// queue was empty. The caller holds mu.
	commitLocked func() bool
	// kick wakes run to commit what is queued; stop tells it to commit
	// what is left and return; done is closed when it has.
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// request is a write queued on a groupCommit: *writeReq or *journalReq.
type request interface {
	reply() *replySlot
}

// replySlot is where the commit that finishes a queued write leaves its
// outcome; both request types embed it.
type replySlot struct {
	// err is this write's own failure, set while its batch is built: the
	// batch goes on without it.
	err error
	// done receives the write's outcome once; buffered, so a commit never
	// blocks on a caller that gave up.
	done chan error
}

func (r *replySlot) reply() *replySlot { return r }

// answer hands the write's outcome to its caller. The caller of answer
// holds the groupCommit's mu.
func (r *replySlot) answer(err error) {
	r.done <- err
}

// init makes the queue, of size writes, committed by commitLocked.
func (q *groupCommit[R]) init(size int, commitLocked func() bool) {
	q.reqs = make(chan R, size)
	q.batch = make([]R, 0, size)
	q.commitLocked = commitLocked
	q.kick = make(chan struct{}, 1)
	q.stop = make(chan struct{})
	q.done = make(chan struct{})
}

// submit queues r and waits until the committer has committed it.
//
// If ctx ends while r is queued but not yet applied, the commit skips it.
// If ctx ends after that, submit returns an error wrapping ctx.Err() at
// once, and the write may or may not be committed: every write here
// replaces a whole record, so repeating it is safe.
func (q *groupCommit[R]) submit(ctx context.Context, s *Store, r R) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case q.reqs <- r:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	// Queued under mu.RLock: Close, which takes mu, stops run only after
	// this, and run commits what is queued before it returns.
	s.mu.RUnlock()
	kick(q.kick)
	select {
	case err := <-r.reply().done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("store write may or may not be committed: %w", ctx.Err())
	}
}

// lock takes mu, for anything that must not run during a commit.
func (q *groupCommit[R]) lock() { q.mu.Lock() }

// unlock releases mu and, if writes are queued, wakes run to commit them.
// Every holder of mu releases it here, whatever it held mu for: a writer
// may have queued meanwhile, and its kick may have been taken by a run
// that then waited for mu.
func (q *groupCommit[R]) unlock() {
	q.mu.Unlock()
	if len(q.reqs) > 0 {
		kick(q.kick)
	}
}

// run is the committer goroutine. It commits the queue when kicked (a
// writer queued its write, or a holder of mu left writes queued) and, when shutdown stops it, commits what is still queued and returns.
func (q *groupCommit[R]) run() {
	defer close(q.done)
	for {
		stopping := false
		select {
		case <-q.kick:
		case <-q.stop:
			// Close holds no writer inside submit any more and no new
			// writer gets past its closed check: this is the last commit.
			stopping = true
		}
		q.lock()
		for q.commitLocked() {
		}
		q.unlock()
		if stopping {
			return
		}
	}
}

// shutdown stops run once it has committed what is queued. Close calls it
// after it has marked the store closed.
func (q *groupCommit[R]) shutdown() {
	close(q.stop)
	<-q.done
}

// queued is how many writes wait in the queue.
func (q *groupCommit[R]) queued() int { return len(q.reqs) }

// startLocked takes the first queued write into a new batch; false when
// the queue is empty. The caller holds mu, and ends the batch with
// endLocked.
func (q *groupCommit[R]) startLocked() ([]R, bool) {
	select {
	case r := <-q.reqs:
		return append(q.batch[:0], r), true
	default:
		return nil, false
	}
}

// endLocked keeps batch's array for the next batch, dropping its
// references to finished writes.
func (q *groupCommit[R]) endLocked(batch []R) {
	clear(batch)
	q.batch = batch[:0]
}

// settleLocked records a finished batch in the metrics and answers each of
// its writes: with its own failure, else with err, the batch's failure,
// else nil. elapsed is the time the batch took. It returns how many writes
// were applied. The caller holds the batch's groupCommit mu.
func settleLocked[R request](s *Store, batch []R, elapsed time.Duration, err error) (applied int) {
	if err == nil {
		for _, r := range batch {
			if r.reply().err == nil {
				applied++
			}
		}
	}
	// Metrics before answers: a caller that got its answer sees them.
	if applied > 0 {
		s.m.commitSeconds.Observe(elapsed.Seconds())
		s.m.batchSize.Observe(float64(applied))
	}
	for _, r := range batch {
		rep := r.reply()
		switch {
		case rep.err != nil:
			if errors.Is(rep.err, context.Canceled) || errors.Is(rep.err, context.DeadlineExceeded) {
				s.m.writesCanceled.Inc()
			} else {
				s.m.writesError.Inc()
			}
			rep.answer(rep.err)
		case err != nil:
			s.m.writesError.Inc()
			rep.answer(fmt.Errorf("commit store %s: %w", s.path, err))
		default:
			s.m.writesOK.Inc()
			rep.answer(nil)
		}
	}
	return applied
}

// kick sends on a wake-up channel of capacity one without blocking; a
// wake-up already pending covers this one.
func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
