package persistence

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// TestStore_Journal_DiskFull makes the journal file unable to grow (a
// file size limit stands in for a full disk): the append that needs more
// room fails and is taken back, and so does each one after it while the
// disk stays full, but the process goes on and no write that returned is
// lost; once there is room, writes work again.
func TestStore_Journal_DiskFull(t *testing.T) {
	for _, noSync := range []bool{true, false} {
		t.Run(fmt.Sprintf("nosync=%t", noSync), func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			cfg := noAutoCheckpoint
			cfg.NoSync = noSync
			s := openT(t, path, cfg)

			var old syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
			limit := old
			limit.Cur = 256 << 10
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
				t.Fatal(err)
			}
			restored := false
			restore := func() {
				if !restored {
					restored = true
					if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
						t.Fatal(err)
					}
				}
			}
			defer restore()

			m := newModel()
			var failed error
			for i := 0; failed == nil; i++ {
				if i > 10_000 {
					t.Fatal("10,000 writes into a journal limited to 256 KiB, none failed")
				}
				v := volumeWithClaim(fmt.Sprintf("v%05d", i))
				m.ids[v.ID] = true
				if failed = s.PutVolume(ctx, v); failed == nil {
					m.vols[v.ID] = v
				}
			}
			t.Logf("PutVolume with no room left: %v", failed)
			if !errors.Is(failed, syscall.EFBIG) {
				t.Fatalf("PutVolume: %v, want the journal's EFBIG", failed)
			}
			if err := s.PutVolume(ctx, volumeWithClaim("again")); !errors.Is(err, syscall.EFBIG) {
				t.Fatalf("PutVolume while still full: %v, want the same error", err)
			}
			m.ids["again"] = true
			m.checkReads(t, s)

			restore()
			m.put(t, s, volumeWithClaim("room"))
			crash(t, s)
			s = openT(t, path, noAutoCheckpoint)
			m.check(t, s)
		})
	}
}
