package persistence

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

func TestStore_Write_ConcurrentEachCallerOwnResult(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	file := storePath(t)
	s := openT(t, file, Config{})

	// Every fifth write fails with its own error and every fifth
	// panics, each after a half-done put; the rest store a key.
	// Writers run at once, so writes meet in batches with
	// others' failures.
	const writers, perWriter = 16, 40
	type outcome struct {
		w, i int
		err  error
		own  error // the error the write failed with, if any
	}
	results := make(chan outcome, writers*perWriter)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				key := fmt.Sprintf("w%02d-%02d", w, i)
				var own error
				apply := putRaw(key)
				switch i % 5 {
				case 1:
					own = fmt.Errorf("write %s refused", key)
					apply = func(tx *bolt.Tx) error {
						if err := putRaw("half-" + key)(tx); err != nil {
							return err
						}
						return own
					}
				case 3:
					apply = func(tx *bolt.Tx) error {
						if err := putRaw("half-" + key)(tx); err != nil {
							return err
						}
						panic("write " + key + " panicked")
					}
				}
				results <- outcome{w, i, s.write(ctx, apply), own}
			}
		})
	}
	wg.Wait()
	close(results)

	var want []string
	for r := range results {
		key := fmt.Sprintf("w%02d-%02d", r.w, r.i)
		switch r.i % 5 {
		case 1:
			if r.err != r.own {
				t.Errorf("%s: got %v, want its own error %v", key, r.err, r.own)
			}
		case 3:
			if !errors.Is(r.err, ErrCorrupt) || !strings.Contains(r.err.Error(), "write "+key+" panicked") {
				t.Errorf("%s: got %v, want ErrCorrupt with its own panic", key, r.err)
			}
		default:
			if r.err != nil {
				t.Errorf("%s: %v", key, r.err)
			}
			want = append(want, key)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	assertStoredIDs(t, file, want)
}

func TestStore_Write_FirstOfBatchFailsRestCommitted(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		fail    func() error // runs at the end of the first write
		wantErr func(error) bool
	}{
		{"error", func() error { return boom }, func(err error) bool { return err == boom }},
		{"panic", func() error { panic("first write panicked") }, func(err error) bool {
			return errors.Is(err, ErrCorrupt) && strings.Contains(err.Error(), "first write panicked")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			s := openT(t, storePath(t), Config{MaxBatchDelay: time.Hour})

			// The first write holds the committer inside its transaction
			// until gate closes, so the others queue behind it and join
			// its batch.
			entered, gate := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				first <- s.write(ctx, func(tx *bolt.Tx) error {
					if err := putRaw("first")(tx); err != nil {
						return err
					}
					select {
					case <-entered:
					default:
						close(entered)
					}
					<-gate
					return tt.fail()
				})
			}()
			<-entered
			const n = 5
			others := make(chan error, n)
			for i := range n {
				go func() { others <- s.write(ctx, putRaw(fmt.Sprintf("f%d", i))) }()
			}
			waitQueued(t, &s.commits, n)
			close(gate)

			if err := <-first; !tt.wantErr(err) {
				t.Errorf("first write: %v, want its own failure", err)
			}
			for range n {
				if err := <-others; err != nil {
					t.Errorf("write queued behind it: %v", err)
				}
			}
			got, err := s.VolumeIDs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"f0", "f1", "f2", "f3", "f4"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("stored %v, want %v (the writes queued behind the first only)", got, want)
			}
		})
	}
}

func TestStore_Write_LeftQueuedCommittedNext(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	reg := prometheus.NewPedanticRegistry()
	// One write per transaction: the blocker's batch is its own write, and
	// the writes queued behind it are left for the next commits.
	s := openT(t, storePath(t), Config{MaxBatchSize: 1, Registerer: reg})
	release := s.blockCommitter(t)
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- s.write(ctx, putRaw(fmt.Sprintf("v%d", i))) }()
	}
	waitQueued(t, &s.commits, 1) // the queue holds one; the others wait to join it
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("write queued behind the blocker: %v", err)
		}
	}
	got, err := s.VolumeIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"v0", "v1", "v2", "v3", "v4"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	// Six transactions of one write each: the blocker's and five more.
	want := batchSizeText(1, 1, 1, 1, 1, 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csiactor_store_commit_batch_size"); err != nil {
		t.Fatal(err)
	}
}

// TestStore_Close_WhileWriting closes a store under writers, of bbolt
// writes and of journaled volume writes.
func TestStore_Close_WhileWriting(t *testing.T) {
	for _, tt := range []struct {
		name      string
		cfg       Config
		minWrites int
		write     func(ctx context.Context, s *Store, key string) error
	}{
		{"bbolt", Config{NoSync: true}, 200, func(ctx context.Context, s *Store, key string) error {
			return s.write(ctx, putRaw(key))
		}},
		// Small checkpoints, so that Close meets them under way.
		{"journal", Config{NoSync: true, CheckpointBytes: 2048, CheckpointDelay: time.Millisecond}, 300, func(ctx context.Context, s *Store, key string) error {
			return s.PutVolume(ctx, volumeWithClaim(key))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			file := storePath(t)
			s := openT(t, file, tt.cfg)
			committed := closeWhileWriting(t, s, tt.minWrites, func(key string) error { return tt.write(ctx, s, key) })
			if files := journalPaths(t, file); len(files) != 0 {
				t.Fatalf("journal files after Close: %v", files)
			}
			assertStoredIDs(t, file, committed)
		})
	}
}

// closeWhileWriting has eight writers call write with new keys, each
// until one of its writes fails, and closes s under them once minWrites
// writes have returned nil. A write may return nil or ErrClosed only, and
// each writer is refused once. It returns the keys of the writes that
// returned nil, sorted: each of them must survive, and no other.
func closeWhileWriting(t *testing.T, s *Store, minWrites int, write func(key string) error) []string {
	t.Helper()
	const writers = 8
	var (
		mu        sync.Mutex
		committed []string // guarded by mu
		refused   int      // guarded by mu
		other     []error  // guarded by mu
	)
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%05d", w, i)
				err := write(key)
				mu.Lock()
				switch {
				case err == nil:
					committed = append(committed, key)
					if len(committed) == minWrites {
						once.Do(func() { close(started) })
					}
				case errors.Is(err, ErrClosed):
					refused++
				default:
					other = append(other, fmt.Errorf("%s: %w", key, err))
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, err := range other {
		t.Errorf("write during Close: %v, want nil or ErrClosed", err)
	}
	if refused != writers {
		t.Fatalf("%d writes refused, want one per writer", refused)
	}
	slices.Sort(committed)
	return committed
}

// assertStoredIDs opens the store at path and fails unless VolumeIDs
// lists exactly want, sorted.
func assertStoredIDs(t *testing.T, path string, want []string) {
	t.Helper()
	got, err := openT(t, path, Config{}).VolumeIDs(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen: %d keys stored, want the %d writes that returned nil exactly (first stored %q)",
			len(got), len(want), got[:min(3, len(got))])
	}
}

func TestStore_PutVolume_IndexUntouchedWhenUnchanged(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{NoSync: true})
	// Enough volumes that both buckets have pages of their own (not
	// inline in the root), half of them active.
	for i := range 1000 {
		v := Volume{ID: fmt.Sprintf("v%04d", i)}
		if i%2 == 0 {
			v = volumeWithClaim(v.ID)
		}
		if err := s.PutVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	// Pages written by the checkpoint that moves one PutVolume into bbolt.
	pagesWritten := func(v Volume) int64 {
		t.Helper()
		before := s.db.Stats()
		if err := s.PutVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := s.checkpoint(); err != nil {
			t.Fatal(err)
		}
		after := s.db.Stats()
		return after.TxStats.GetWrite() - before.TxStats.GetWrite()
	}
	stillActive := pagesWritten(volumeWithClaim("v0500"))
	stillIdle := pagesWritten(Volume{ID: "v0501"})
	if stillActive != stillIdle {
		t.Errorf("rewriting an active volume wrote %d pages, an idle one %d: want the same (index untouched)", stillActive, stillIdle)
	}
	if nowIdle := pagesWritten(Volume{ID: "v0500"}); nowIdle <= stillActive {
		t.Errorf("an active volume becoming idle wrote %d pages, want more than %d (the index changes)", nowIdle, stillActive)
	}
	if nowActive := pagesWritten(volumeWithClaim("v0501")); nowActive <= stillActive {
		t.Errorf("an idle volume becoming active wrote %d pages, want more than %d (the index changes)", nowActive, stillActive)
	}
	got := activeIDs(t, s)
	if !slices.Contains(got, "v0501") || slices.Contains(got, "v0500") || len(got) != 500 {
		t.Fatalf("ActiveVolumes: %d volumes, v0500 in: %t, v0501 in: %t; want 500, false, true",
			len(got), slices.Contains(got, "v0500"), slices.Contains(got, "v0501"))
	}
}
