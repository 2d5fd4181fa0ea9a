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
	replySlot
	ctx context.Context
	// apply makes the write inside the batch transaction. It may run more
	// than once (when another write of the batch fails, the batch is rolled
	// back and run again without it), so it must depend only on tx.
	apply func(tx *bolt.Tx) error
}

// errRetryBatch rolls a batch back after one of its writes failed.
var errRetryBatch = errors.New("persistence: retry batch without the failed write")

// write queues apply and waits until it is durable: committed by the
// caller itself when no commit is running, else by whoever commits next
// (groupCommit.submit, which also says what an ending ctx does).
func (s *Store) write(ctx context.Context, apply func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.commits.submit(ctx, s, &writeReq{ctx: ctx, apply: apply, replySlot: replySlot{done: make(chan error, 1)}})
}

// commitLocked commits the first queued write and the writes queued behind
// it, up to MaxBatchSize writes or MaxBatchDelay of gathering, in one
// transaction, and answers each of them. It never waits for a write that
// has not arrived. It reports false when the queue was empty. The caller
// holds commits.mu.
func (s *Store) commitLocked() bool {
	batch, ok := s.commits.startLocked()
	if !ok {
		return false
	}
	start := time.Now()
	var err error
	for {
		err = s.update(func(tx *bolt.Tx) error {
			for i := 0; ; i++ {
				if i == len(batch) {
					if len(batch) >= s.cfg.MaxBatchSize || time.Since(start) >= s.cfg.MaxBatchDelay {
						return nil
					}
					select {
					case r := <-s.commits.reqs:
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
	if err != nil {
		s.log.WithField("writes", len(batch)).WithError(err).Error("store commit failed")
	}
	settleLocked(s, batch, elapsed, err)
	s.commits.endLocked(batch)
	return true
}
