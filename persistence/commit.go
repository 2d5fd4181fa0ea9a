package persistence

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writeReq is one caller's write, queued for whoever commits next.
type writeReq struct {
	ctx context.Context
	// apply makes the write inside the batch transaction. It may run more
	// than once (when another write of the batch fails, the batch is rolled
	// back and run again without it), so it must depend only on tx.
	apply func(tx *bolt.Tx) error
	// err is this write's own failure, set while its batch is built.
	err error
	// answered is set, with res, by the commit that finished this write;
	// both guarded by Store.commitMu.
	answered bool
	res      error
	// done receives res once; buffered, so a commit never blocks on a
	// caller that gave up.
	done chan error
}

// errRetryBatch rolls a batch back after one of its writes failed.
var errRetryBatch = errors.New("persistence: retry batch without the failed write")

// write queues apply and waits until it is durable.
//
// The caller queues its write and then tries to take commitMu. If it gets
// it (no commit is running: the usual case for a lone write), it commits
// the queue itself, its own write included, in its own goroutine: no
// hand-off to another goroutine and back. If a commit is running, the
// caller waits; whoever holds commitMu makes sure the queue is committed
// after it (see unlockCommit).
//
// If ctx ends while the write is queued but not yet applied, the commit
// skips it. If ctx ends after that, write returns an error wrapping
// ctx.Err() at once, and the write may or may not be committed: every
// write here replaces a whole record, so repeating it is safe. A caller
// that is committing returns when its commit is done, whatever ctx says.
func (s *Store) write(ctx context.Context, apply func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &writeReq{ctx: ctx, apply: apply, done: make(chan error, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	// Still under mu.RLock, so Close waits for a committing caller.
	if !s.handOff && s.commitMu.TryLock() {
		defer s.mu.RUnlock()
		return s.lead(r)
	}
	if s.handOff {
		kick(s.kick)
	}
	s.mu.RUnlock()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("store write may or may not be committed: %w", ctx.Err())
	}
}

// lead commits the queue until r, which is queued, is answered, and
// returns r's outcome. The caller holds commitMu, which lead releases.
func (s *Store) lead(r *writeReq) error {
	defer s.unlockCommit()
	for !r.answered {
		// Whoever takes r out of the queue holds commitMu and answers it
		// before releasing it: r is queued until this commits it.
		if !s.commitLocked() {
			panic("persistence: a queued write left the queue unanswered")
		}
	}
	return r.res
}

// unlockCommit releases commitMu and, if writes are queued, wakes the
// committer goroutine to commit them. Every holder of commitMu releases it
// here: a writer that queued while commitMu was held, and so did not commit
// itself, is then always committed by someone.
func (s *Store) unlockCommit() {
	s.commitMu.Unlock()
	if len(s.reqs) > 0 {
		kick(s.kick)
	}
}

// run is the committer goroutine. It commits the queue when kicked (a
// commit left writes queued behind it) and, when Close stops it, commits
// what is still queued and returns.
func (s *Store) run() {
	defer close(s.done)
	for {
		select {
		case <-s.kick:
		case <-s.stop:
			// Close holds no writer inside write any more and no new
			// writer gets past its closed check: this is the last commit.
			s.commitMu.Lock()
			for s.commitLocked() {
			}
			s.commitMu.Unlock()
			return
		}
		s.commitMu.Lock()
		for s.commitLocked() {
		}
		s.unlockCommit()
	}
}

// commitLocked commits the first queued write and the writes queued behind
// it, up to MaxBatchSize writes or MaxBatchDelay of gathering, in one
// transaction, and answers each of them. It never waits for a write that
// has not arrived. It reports false when the queue was empty. The caller
// holds commitMu.
func (s *Store) commitLocked() bool {
	var first *writeReq
	select {
	case first = <-s.reqs:
	default:
		return false
	}
	start := time.Now()
	batch := append(s.batch[:0], first)
	var err error
	for {
		err = s.update(func(tx *bolt.Tx) error {
			for i := 0; ; i++ {
				if i == len(batch) {
					if len(batch) >= s.cfg.MaxBatchSize || time.Since(start) >= s.cfg.MaxBatchDelay {
						return nil
					}
					select {
					case r := <-s.reqs:
						batch = append(batch, r)
					default:
						return nil
					}
				}
				r := batch[i]
				if r.err != nil {
					continue
				}
				if err := r.ctx.Err(); err != nil {
					r.err = fmt.Errorf("store write not applied: %w", err)
					continue
				}
				if err := guard(s.path, func() error { return r.apply(tx) }); err != nil {
					r.err = err
					return errRetryBatch
				}
			}
		})
		if !errors.Is(err, errRetryBatch) {
			break
		}
	}
	elapsed := time.Since(start)

	applied := 0
	for _, r := range batch {
		if r.err == nil && err == nil {
			applied++
		}
	}
	if err != nil {
		s.log.WithField("writes", len(batch)).WithError(err).Error("store commit failed")
	}
	// Metrics before answers: a caller that got its answer sees them.
	if applied > 0 {
		s.m.commitSeconds.Observe(elapsed.Seconds())
		s.m.batchSize.Observe(float64(applied))
	}
	for _, r := range batch {
		switch {
		case r.err != nil:
			if errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded) {
				s.m.writesCanceled.Inc()
			} else {
				s.m.writesError.Inc()
			}
			r.answer(r.err)
		case err != nil:
			s.m.writesError.Inc()
			r.answer(fmt.Errorf("commit store %s: %w", s.path, err))
		default:
			s.m.writesOK.Inc()
			r.answer(nil)
		}
	}
	clear(batch) // drop references to finished requests
	s.batch = batch[:0]
	return true
}

// answer records r's outcome and hands it to its caller. The caller of
// answer holds commitMu.
func (r *writeReq) answer(err error) {
	r.answered = true
	r.res = err
	r.done <- err
}
