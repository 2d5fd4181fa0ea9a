package persistence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/testbin"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

func TestStore_PutVolume_ConcurrentWritersDurable(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, Config{})
	const writers, perWriter = 64, 50
	testbin.Parallel(t, writers, func(w int) error {
		for i := range perWriter {
			v := volumeWithClaim(fmt.Sprintf("w%02d-v%02d", w, i))
			v.Revision = uint64(i)
			if err := s.PutVolume(ctx, v); err != nil {
				return err
			}
			// Every writer also rewrites its first volume, so many
			// writes in a batch touch the same keys.
			first := volumeWithClaim(fmt.Sprintf("w%02d-v00", w))
			first.Revision = uint64(100 + i)
			if err := s.PutVolume(ctx, first); err != nil {
				return err
			}
		}
		return nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, path, Config{})
	vols, err := s.ActiveVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != writers*perWriter {
		t.Fatalf("after reopen: %d volumes, want %d", len(vols), writers*perWriter)
	}
	for _, v := range vols {
		var w, i int
		if _, err := fmt.Sscanf(v.ID, "w%02d-v%02d", &w, &i); err != nil {
			t.Fatalf("unexpected volume %q", v.ID)
		}
		want := uint64(i)
		if i == 0 {
			want = 100 + perWriter - 1 // the writer's last rewrite wins
		}
		if v.Revision != want {
			t.Errorf("%s: revision %d, want %d", v.ID, v.Revision, want)
		}
	}
}

func TestStore_Commit_OneBatchEachCallerOwnResult(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	reg := prometheus.NewPedanticRegistry()
	// A long gathering window: the batch is whatever queued behind the
	// blocked committer, however slow the race detector makes this test.
	s := openT(t, storePath(t), Config{Registerer: reg, MaxBatchDelay: time.Hour})

	release := s.blockCommitter(t)
	boom := errors.New("boom")
	const good = 10
	results := make(chan error, good+2)
	for i := range good {
		go func() { results <- s.write(ctx, putRaw(fmt.Sprintf("v%d", i))) }()
	}
	failed := make(chan error, 1)
	panicked := make(chan error, 1)
	go func() {
		failed <- s.write(ctx, func(tx *bolt.Tx) error {
			// Half-done work of a failing write must not be committed.
			if err := tx.Bucket([]byte(bucketVolumes)).Put([]byte("half"), []byte("{}")); err != nil {
				return err
			}
			return boom
		})
	}()
	go func() {
		panicked <- s.write(ctx, func(tx *bolt.Tx) error { panic("bad page") })
	}()
	waitQueued(t, &s.commits, good+2)
	release()

	for range good {
		if err := <-results; err != nil {
			t.Errorf("good write in a batch with failures: %v", err)
		}
	}
	if err := <-failed; !errors.Is(err, boom) {
		t.Errorf("failing write: %v, want its own error", err)
	}
	if err := <-panicked; !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "bad page") {
		t.Errorf("panicking write: %v, want ErrCorrupt with the panic", err)
	}
	ids, err := s.VolumeIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != good {
		t.Fatalf("stored %v, want the %d good volumes only", ids, good)
	}

	// The blocker's write and the 12 queued behind it were one batch
	// (13 writes, 11 committed): the batch-size histogram has one
	// observation of 11.
	want := batchSizeText(11) + `
# HELP csiactor_store_writes_total Store writes by result: ok (durable when it returned), deferred (a volume claim step kept in memory and made durable by the next checkpoint, see PutVolumeDeferred), error (rejected by the store or the disk) or canceled (the caller's context ended before the write was applied).
# TYPE csiactor_store_writes_total counter
csiactor_store_writes_total{result="canceled"} 0
csiactor_store_writes_total{result="deferred"} 0
csiactor_store_writes_total{result="error"} 2
csiactor_store_writes_total{result="ok"} 11
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"csiactor_store_commit_batch_size", "csiactor_store_writes_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "csiactor_store_commit_seconds", "csiactor_store_queued_writes"); err != nil || n != 2 {
		t.Fatalf("commit_seconds and queued_writes: %d series, %v; want 2", n, err)
	}
}

// TestStore_Write_CanceledWhileQueuedIsSkipped cancels a write while it
// is queued behind a running commit: it returns context.Canceled, and is
// neither applied nor, for the journal, appended (a crash and replay do
// not bring it back).
func TestStore_Write_CanceledWhileQueuedIsSkipped(t *testing.T) {
	for _, q := range writeQueues {
		t.Run(q.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			s := openT(t, path, Config{})

			release := q.block(s, t)
			wctx, cancel := context.WithCancel(ctx)
			res := make(chan error, 1)
			go func() { res <- q.write(wctx, s, "late") }()
			waitQueued(t, q.queue(s), 1)
			cancel()
			if err := <-res; !errors.Is(err, context.Canceled) {
				t.Fatalf("write with canceled ctx: %v, want context.Canceled", err)
			}
			release()
			// A write queued after the canceled one proves the batch has
			// been committed before we look.
			if err := q.write(ctx, s, "after"); err != nil {
				t.Fatal(err)
			}
			if in, err := q.stored(ctx, s, "late"); err != nil || in {
				t.Fatalf("canceled write was applied: stored %t, %v; want false", in, err)
			}
			crash(t, s)
			s = openT(t, path, Config{})
			if in, err := q.stored(ctx, s, "late"); err != nil || in {
				t.Fatalf("canceled write replayed: stored %t, %v; want false", in, err)
			}
			if in, err := q.stored(ctx, s, "after"); err != nil || !in {
				t.Fatalf("the write after it after replay: stored %t, %v; want true", in, err)
			}
		})
	}
}

func TestStore_Commit_CanceledBeforeQueue(t *testing.T) {
	s := openT(t, storePath(t), Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.PutVolume(ctx, Volume{ID: "v"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("PutVolume: %v, want context.Canceled", err)
	}
	if _, err := s.Volume(ctx, "v"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Volume: %v, want context.Canceled", err)
	}
}

func TestStore_Metrics_UnregisteredOnClose(t *testing.T) {
	ctx := ctxT(t)
	reg := prometheus.NewPedanticRegistry()
	path := storePath(t)
	s := openT(t, path, Config{Registerer: reg})
	if err := s.PutVolume(ctx, Volume{ID: "v"}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP csiactor_store_writes_total Store writes by result: ok (durable when it returned), deferred (a volume claim step kept in memory and made durable by the next checkpoint, see PutVolumeDeferred), error (rejected by the store or the disk) or canceled (the caller's context ended before the write was applied).
# TYPE csiactor_store_writes_total counter
csiactor_store_writes_total{result="canceled"} 0
csiactor_store_writes_total{result="deferred"} 0
csiactor_store_writes_total{result="error"} 0
csiactor_store_writes_total{result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csiactor_store_writes_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "csiactor_store_commit_seconds"); err != nil || n != 1 {
		t.Fatalf("csiactor_store_commit_seconds: %d series, %v", n, err)
	}

	// A second store on the same registry while the first is open is
	// refused, and leaves no goroutine or lock behind.
	if _, err := Open(storePath(t), Config{Registerer: reg}); err == nil || !strings.Contains(err.Error(), "register store metrics") {
		t.Fatalf("second store on one registry: %v, want a registration error", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("after Close: %d series still registered, %v", n, err)
	}
	s = openT(t, path, Config{Registerer: reg})
	if _, err := s.Volume(ctx, "v"); err != nil {
		t.Fatal(err)
	}
}
