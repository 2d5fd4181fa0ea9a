package persistence

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// TestStore_Journal_DiskFullAtRotation makes the next segment impossible
// to preallocate (a file size limit stands in for a full disk): the write
// that needs it fails, before anything of it is written, and so does each
// one after it while the disk stays full, but the process goes on and no
// write that returned is lost; once there is room, writes work again.
func TestStore_Journal_DiskFullAtRotation(t *testing.T) {
	for _, noSync := range []bool{true, false} { // mapped, pwrite
		t.Run(fmt.Sprintf("nosync=%t", noSync), func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			cfg := noAutoCheckpoint
			cfg.NoSync = noSync
			s := openT(t, path, cfg)
			if err := s.setSegments(segmentAuto, minSegmentBytes); err != nil {
				t.Fatal(err)
			}
			s.j.rotMu.Lock()
			s.j.segBytes = 4 << 20 // the next segment: more than the limit below
			s.j.rotMu.Unlock()

			var old syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
			limit := old
			limit.Cur = 1 << 20
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
				if i > 1000 {
					t.Fatal("1000 writes into a segment of 16 KiB, none failed")
				}
				v := volumeWithClaim(fmt.Sprintf("v%03d", i))
				m.ids[v.ID] = true
				if failed = s.PutVolume(ctx, v); failed == nil {
					m.vols[v.ID] = v
				}
			}
			t.Logf("PutVolume with no room for the next segment: %v", failed)
			if !errors.Is(failed, syscall.EFBIG) {
				t.Fatalf("PutVolume: %v, want an error of the next segment's preallocation", failed)
			}
			if err := s.PutVolume(ctx, volumeWithClaim("again")); !errors.Is(err, syscall.EFBIG) {
				t.Fatalf("PutVolume while still full: %v, want the same error", err)
			}
			m.ids["again"] = true
			if n := len(journalPaths(t, path)); n != 1 {
				t.Fatalf("%d journal files, want the one in use (a failed segment is removed)", n)
			}
			m.checkReads(t, s)

			restore()
			m.put(t, s, volumeWithClaim("room"))
			if n := len(journalPaths(t, path)); n != 2 {
				t.Fatalf("%d journal files, want the full one and the next", n)
			}
			crash(t, s)
			s = openT(t, path, noAutoCheckpoint)
			m.check(t, s)
		})
	}
}
