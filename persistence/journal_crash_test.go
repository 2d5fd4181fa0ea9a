package persistence

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crashEnv makes the test binary a helper process that writes volumes
// until it is killed (see crashWriter). Its value is "<path>|<mode>|<prefix>".
const crashEnv = "CSIACTOR_TEST_CRASH_WRITER"

// Shape of crashWriter's writes: crashWriters goroutines; writer w's op i
// is on volume crashID(prefix, w, i), a delete when i%7 == 3, else a put
// of crashVolume(id, i).
const (
	crashWriters = 4
	crashSlots   = 6
)

func crashID(prefix string, w, i int) string {
	return fmt.Sprintf("%s-w%d-v%d", prefix, w, i%crashSlots)
}

func crashIsDelete(i int) bool { return i%7 == 3 }

// crashVolume is put i of a volume: active (a claim) when i is even, idle
// otherwise, so that the index changes back and forth.
func crashVolume(id string, i int) Volume {
	if i%2 == 0 {
		v := volumeWithClaim(id)
		v.Revision = uint64(i)
		return v
	}
	return Volume{ID: id, Plugin: "p", ExternalID: "x-" + id, Revision: uint64(i)}
}

// crashConfig is the store config of crashWriter: checkpoints all the
// time, so that kills land in every phase of one.
func crashConfig(mode string) Config {
	return Config{NoSync: mode == "nosync", CheckpointBytes: 8 << 10, CheckpointDelay: 2 * time.Millisecond}
}

// crashWriter opens the store, prints "ready", and then has each writer
// print "<w> <i>" after its op i returned nil, forever.
func crashWriter(spec string) {
	parts := strings.Split(spec, "|")
	s, err := Open(parts[0], crashConfig(parts[1]))
	if err != nil {
		fmt.Println("error:", err.Error())
		os.Exit(1)
	}
	prefix := parts[2]
	fmt.Println("ready")
	ctx := context.Background()
	for w := range crashWriters {
		go func() {
			for i := 0; ; i++ {
				id := crashID(prefix, w, i)
				var err error
				if crashIsDelete(i) {
					err = s.DeleteVolume(ctx, id)
				} else {
					err = s.PutVolume(ctx, crashVolume(id, i))
				}
				if err != nil {
					fmt.Println("error:", err.Error())
					os.Exit(1)
				}
				// One write(2) per line: lines never interleave.
				fmt.Printf("%d %d\n", w, i)
			}
		}()
	}
	select {}
}

// crashState is the record a volume must have after op i (nil: absent).
func crashState(prefix string, w, i int) *Volume {
	if i < 0 || crashIsDelete(i) {
		return nil
	}
	v := crashVolume(crashID(prefix, w, i), i)
	return &v
}

// runCrashWriter runs crashWriter on path until at least lines ops have
// been reported, kills it with SIGKILL, and returns the last op each
// writer reported as returned (-1 for none).
func runCrashWriter(t *testing.T, path, mode, prefix string, lines int) [crashWriters]int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+path+"|"+mode+"|"+prefix, "GORACE=atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("crash writer: %q, %v", line, err)
	}
	last := [crashWriters]int{}
	for w := range last {
		last[w] = -1
	}
	seen := 0
	killed := false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			// EOF after the kill; a line cut short was not reported.
			if !killed {
				_ = cmd.Wait()
				t.Fatalf("crash writer ended before it was killed: %v", err)
			}
			break
		}
		if strings.HasPrefix(line, "error:") {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("crash writer: %s", line)
		}
		f := strings.Fields(line)
		w, err1 := strconv.Atoi(f[0])
		i, err2 := strconv.Atoi(f[1])
		if len(f) != 2 || err1 != nil || err2 != nil || i != last[w]+1 {
			t.Fatalf("crash writer printed %q after op %d of writer %d", line, last[w], w)
		}
		last[w] = i
		if seen++; seen == lines {
			// Lines already in the pipe are read on: they were printed,
			// so their ops had returned.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("crash writer exit: %v, want killed by SIGKILL", err)
	}
	return last
}

// TestStore_Journal_KilledWhileWriting kills a process writing volumes
// (with checkpoints running all the time) with SIGKILL, several times, and
// checks after each that every write it reported as returned is in the
// reopened store, that the one write per writer in flight is there or not
// (never anything else), that the active-volume index agrees, and that
// the store is usable. Each round adds volumes of its own; all earlier
// rounds' volumes must stay as they were.
func TestStore_Journal_KilledWhileWriting(t *testing.T) {
	for _, tt := range []struct {
		mode  string
		lines int
	}{{"sync", 500}, {"nosync", 4000}} {
		t.Run(tt.mode, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			want := map[string]*Volume{} // every volume of every round: nil means absent
			for round := range 4 {
				prefix := fmt.Sprintf("r%d", round)
				last := runCrashWriter(t, path, tt.mode, prefix, tt.lines+round*37) // kills land at different points

				cfg, hook := hookedConfig()
				s, err := Open(path, cfg)
				if err != nil {
					t.Fatalf("round %d: Open after the kill: %v", round, err)
				}
				for _, e := range hook.AllEntries() {
					t.Logf("round %d: Open logged: %s", round, e.Message)
				}
				for w := range crashWriters {
					for slot := range crashSlots {
						id := crashID(prefix, w, slot)
						// The last reported op on this volume, and the op
						// in flight if it is on this volume.
						reported := last[w] - ((last[w]-slot)%crashSlots+crashSlots)%crashSlots
						allowed := []*Volume{crashState(prefix, w, reported)}
						if next := last[w] + 1; next%crashSlots == slot {
							allowed = append(allowed, crashState(prefix, w, next))
						}
						got, err := s.Volume(ctx, id)
						var have *Volume
						switch {
						case err == nil:
							have = &got
						case !errors.Is(err, ErrNotFound):
							t.Fatalf("Volume(%s): %v", id, err)
						}
						ok := false
						for _, a := range allowed {
							ok = ok || (a == nil && have == nil) || (a != nil && have != nil && a.Revision == have.Revision && a.Active() == have.Active())
						}
						if !ok {
							t.Fatalf("round %d: %s after the kill is %s; writer %d reported op %d as its last, so want %s",
								round, id, describe(have), w, last[w], describeAll(allowed))
						}
						want[id] = have
					}
				}
				checkCrashVolumes(t, s, want)
				// Usable: a write survives Close and Open.
				if err := s.PutVolume(ctx, volumeWithClaim(prefix+"-after")); err != nil {
					t.Fatal(err)
				}
				v := volumeWithClaim(prefix + "-after")
				want[v.ID] = &v
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s := openT(t, path, Config{})
			checkCrashVolumes(t, s, want)
		})
	}
}

// checkCrashVolumes checks every volume of want with Volume, and that
// ActiveVolumes lists exactly the active ones.
func checkCrashVolumes(t *testing.T, s *Store, want map[string]*Volume) {
	t.Helper()
	ctx := context.Background()
	wantActive := map[string]bool{}
	for id, v := range want {
		got, err := s.Volume(ctx, id)
		switch {
		case v == nil && !errors.Is(err, ErrNotFound):
			t.Fatalf("Volume(%s) = %v, want ErrNotFound", id, err)
		case v != nil && (err != nil || got.Revision != v.Revision):
			t.Fatalf("Volume(%s) = revision %d, %v; want revision %d", id, got.Revision, err, v.Revision)
		}
		if v != nil && v.Active() {
			wantActive[id] = true
		}
	}
	active, err := s.ActiveVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range active {
		if !wantActive[v.ID] {
			t.Fatalf("ActiveVolumes lists %s, which is idle or absent", v.ID)
		}
	}
	if len(active) != len(wantActive) {
		t.Fatalf("ActiveVolumes lists %d volumes, want %d", len(active), len(wantActive))
	}
}

func describe(v *Volume) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprintf("revision %d (active %t)", v.Revision, v.Active())
}

func describeAll(vs []*Volume) string {
	var s []string
	for _, v := range vs {
		s = append(s, describe(v))
	}
	return strings.Join(s, " or ")
}

// TestStore_Open_JournalInUseByAnotherProcess has another process hold the
// store with writes in its journal: Open fails with ErrInUse and leaves
// every file of the data dir as it was; once the other process closes,
// its writes are there.
func TestStore_Open_JournalInUseByAnotherProcess(t *testing.T) {
	checkLeaks(t)
	path := storePath(t)
	release := holdInChild(t, path, 5)
	dir := filepath.Dir(path)
	before := dirFiles(t, dir)
	if files := journalPaths(t, path); len(files) != 1 || !journalWritten(before[filepath.Base(files[0])]) {
		t.Fatalf("the helper's journal is %v, want one file with writes", files)
	}

	_, err := Open(path, Config{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrInUse) {
		t.Errorf("Open while another process holds the store: %v, want ErrInUse", err)
	}
	assertDirUnchanged(t, dir, before)

	release()
	s := openT(t, path, Config{})
	ids, err := s.VolumeIDs(ctxT(t))
	if err != nil || len(ids) != 5 {
		t.Fatalf("the helper's volumes: %v, %v; want 5", ids, err)
	}
}
