//go:build linux && (amd64 || arm64)

package persistence

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/testbin"
	"unsafe"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// newAIOSyncerT returns a syncer closed when the test ends, or skips a
// test on a host without AIO (the store then syncs with fdatasync, which
// the other tests cover).
func newAIOSyncerT(t *testing.T) *aioSyncer {
	t.Helper()
	a, err := newAIOSyncer()
	if err != nil {
		t.Skipf("this host has no Linux AIO (%v): the journal syncs with fdatasync here", err)
	}
	t.Cleanup(func() {
		if err := a.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a
}

// TestAIOSyncer_Sync syncs a file from several goroutines at once: each
// sync returns only when the kernel has reported the completion of its
// own fdsync request.
func TestAIOSyncer_Sync(t *testing.T) {
	a := newAIOSyncerT(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	testbin.Parallel(t, 4, func(w int) error {
		for i := range 25 {
			if _, err := f.WriteAt([]byte{byte(w), byte(i)}, int64(2*(w*25+i))); err != nil {
				return err
			}
			if err := a.sync(f); err != nil {
				return err
			}
		}
		return nil
	})
	// The last completion is the kernel's answer to our request.
	if got, want := a.ev.obj, uint64(uintptr(unsafe.Pointer(&a.cb))); got != want || a.ev.res != 0 {
		t.Fatalf("last completion: obj %#x res %d, want obj %#x res 0", got, a.ev.res, want)
	}
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 200 {
		t.Fatalf("file has %d bytes, want 200", len(data))
	}
}

// TestAIOSyncer_Refused: a descriptor without fsync (a pipe) is refused
// with errAIOUnsupported, a closed file is an error of its own, and
// neither leaves anything behind for the next sync.
func TestAIOSyncer_Refused(t *testing.T) {
	a := newAIOSyncerT(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := a.sync(w); !errors.Is(err, errAIOUnsupported) {
		t.Fatalf("sync of a pipe: %v, want errAIOUnsupported", err)
	}
	closed, err := os.Create(filepath.Join(t.TempDir(), "closed"))
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if err := a.sync(closed); err == nil || errors.Is(err, errAIOUnsupported) {
		t.Fatalf("sync of a closed file: %v, want an error other than errAIOUnsupported", err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := a.sync(f); err != nil {
		t.Fatalf("sync after the refusals: %v", err)
	}
}

// TestStore_Journal_AIORefusedFallsBack: when the kernel stops taking the
// journal's AIO syncs (here its context is destroyed under it), the write
// that finds out is synced with fdatasync instead, the syncer is dropped
// with one log line, and every write is there after a reopen.
func TestStore_Journal_AIORefusedFallsBack(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	cfg := noAutoCheckpoint
	cfg.Logger = logrus.NewEntry(logger)
	s, err := Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.j.aio == nil {
		_ = s.Close()
		t.Skip("this host has no Linux AIO: the journal syncs with fdatasync here")
	}
	if err := s.PutVolume(ctx, volumeWithClaim("vol-1")); err != nil {
		t.Fatal(err)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_IO_DESTROY, s.j.aio.ctx, 0, 0); e != 0 {
		t.Fatalf("io_destroy: %v", e)
	}
	for _, id := range []string{"vol-2", "vol-3"} {
		if err := s.PutVolume(ctx, volumeWithClaim(id)); err != nil {
			t.Fatalf("PutVolume(%s) after the AIO context went away: %v", id, err)
		}
	}
	s.j.appends.lock()
	dropped := s.j.aio == nil
	s.j.appends.unlock()
	if !dropped {
		t.Fatal("the journal still has its AIO syncer")
	}
	var lines int
	for _, e := range hook.AllEntries() {
		if e.Message == "store journal: syncing with fdatasync from now on" {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("%d fallback log lines, want 1", lines)
	}
	if err := s.close(false); err != nil { // leave the journal to replay
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	for _, id := range []string{"vol-1", "vol-2", "vol-3"} {
		if _, err := s.Volume(ctx, id); err != nil {
			t.Fatalf("Volume(%s) after reopen: %v", id, err)
		}
	}
}
