package persistence

import "testing"

// TestGroupCommit_UnlockCommitsWriterQueuedBehind holds each queue's lock
// for something other than a commit (as the journal's checkpoints do)
// while a lone writer queues behind it. The committer goroutine, woken by
// the writer, waits for the lock, and nothing else would wake it again
// (no other writer, no timed checkpoint): only unlock can see that the
// write is committed. Without that the write would wait until its ctx ends.
func TestGroupCommit_UnlockCommitsWriterQueuedBehind(t *testing.T) {
	for _, q := range writeQueues {
		t.Run(q.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			s := openT(t, storePath(t), noAutoCheckpoint)
			for i := range 3 {
				q.queue(s).lock()
				res := make(chan error, 1)
				go func() { res <- q.write(ctx, s, "v") }()
				waitQueued(t, q.queue(s), 1)
				q.queue(s).unlock()
				if err := <-res; err != nil {
					t.Fatalf("write %d queued behind a holder of the lock: %v", i, err)
				}
			}
			if in, err := q.stored(ctx, s, "v"); err != nil || !in {
				t.Fatalf("stored %t, %v; want true", in, err)
			}
		})
	}
}
