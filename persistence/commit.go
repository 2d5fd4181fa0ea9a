package persistence

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writeReq is one caller's write, queued for the committer.
type writeReq struct {
	ctx context.Context
	// apply makes the write inside the batch transaction. It may run more
	// than once (when another write of the batch fails, the batch is rolled
	// back and run again without it), so it must depend only on tx.
	apply func(tx *bolt.Tx) error
	// err is this write's own failure, set by the committer.
	err error
	// done receives the outcome once; buffered, so the committer never
	// blocks on a caller that gave up.
	done chan error
}

// errRetryBatch rolls a batch back after one of its writes failed.
var errRetryBatch = errors.New("persistence: retry batch without the failed write")

// write queues apply for the committer and waits until it is durable.
//
// If ctx ends while the write is queued but not yet applied, the committer
// skips it. If ctx ends after that, write returns an error wrapping
// ctx.Err() at once, and the write may or may not be committed: every write
// here replaces a whole record, so repeating it is safe.
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
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("store write may or may not be committed: %w", ctx.Err())
	}
}

// run is the committer goroutine: it takes the first queued write, builds a
// transaction from it and whatever else is already queued, commits, and
// answers every caller of the batch. It returns when reqs is closed and
// drained.
func (s *Store) run() {
	defer close(s.done)
	for first := range s.reqs {
		s.commit(first)
	}
}

// commit commits first and the writes queued behind it, up to MaxBatchSize
// writes or MaxBatchDelay of gathering, in one transaction. It never waits
// for a write that has not arrived.
func (s *Store) commit(first *writeReq) {
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
					case r, ok := <-s.reqs:
						if !ok {
							return nil
						}
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
		switch {
		case r.err != nil:
			if errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded) {
				s.m.writesCanceled.Inc()
			} else {
				s.m.writesError.Inc()
			}
			r.done <- r.err
		case err != nil:
			s.m.writesError.Inc()
			r.done <- fmt.Errorf("commit store %s: %w", s.path, err)
		default:
			applied++
			s.m.writesOK.Inc()
			r.done <- nil
		}
	}
	if err != nil {
		s.log.WithField("writes", len(batch)).WithError(err).Error("store commit failed")
	}
	if applied > 0 {
		s.m.commitSeconds.Observe(elapsed.Seconds())
		s.m.batchSize.Observe(float64(applied))
	}
	clear(batch) // drop references to finished requests
	s.batch = batch[:0]
}
