package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // "" means valid
	}{
		{"zero", Config{}, ""},
		{"default", DefaultConfig(), ""},
		{"negative lock timeout", Config{LockTimeout: -time.Second}, "lock_timeout"},
		{"negative batch delay", Config{MaxBatchDelay: -1}, "max_batch_delay"},
		{"negative batch size", Config{MaxBatchSize: -1}, "max_batch_size"},
		{"negative checkpoint bytes", Config{CheckpointBytes: -1}, "checkpoint_bytes"},
		{"negative checkpoint delay", Config{CheckpointDelay: -time.Second}, "checkpoint_delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate: %v, want ErrInvalidConfig naming %q", err, tt.field)
			}
		})
	}
}

func TestStore_Open_InvalidConfig(t *testing.T) {
	path := storePath(t)
	_, err := Open(path, Config{MaxBatchSize: -3})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open: %v, want ErrInvalidConfig", err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open with a bad config created %s (stat: %v)", filepath.Dir(path), err)
	}
	if _, err := Open("", Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open(\"\"): %v, want ErrInvalidConfig", err)
	}
}

func TestStore_Open_NewFileModes(t *testing.T) {
	path := storePath(t)
	openT(t, path, Config{})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("file mode %o, want 600", got)
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if got := di.Mode().Perm(); got != 0o700 {
		t.Errorf("dir mode %o, want 700", got)
	}
}

func TestStore_Open_ReopenKeepsEverything(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)

	s := openT(t, path, Config{})
	var want []Allocation
	for _, id := range []string{"c", "a", "b"} {
		a, err := s.PutAllocation(ctx, Allocation{ID: id, Plugin: "hostpath", Type: "node", Command: []string{"/bin/plugin", "-v"}, Env: map[string]string{"K": "V"}})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, a)
	}
	vols := map[string]Volume{}
	for i := range 5 {
		v := volumeWithClaim(fmt.Sprintf("vol-%d", i))
		if i%2 == 0 {
			v.PastClaims = v.Claims
			v.PastClaims[0].State = "node-detached"
			v.Claims = nil
		}
		if err := s.PutVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		vols[v.ID] = v
	}
	idle := Volume{ID: "idle", Plugin: "hostpath", ExternalID: "x"}
	if err := s.PutVolume(ctx, idle); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, path, Config{})
	got, err := s.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Allocations after reopen:\n got %+v\nwant %+v", got, want)
	}
	for id, v := range vols {
		g, err := s.Volume(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, v) {
			t.Errorf("Volume(%s) after reopen:\n got %+v\nwant %+v", id, g, v)
		}
	}
	active, err := s.ActiveVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(active) != len(vols) {
		t.Fatalf("ActiveVolumes: %d volumes, want %d", len(active), len(vols))
	}
	for _, v := range active {
		if !reflect.DeepEqual(v, vols[v.ID]) {
			t.Errorf("ActiveVolumes %s:\n got %+v\nwant %+v", v.ID, v, vols[v.ID])
		}
	}
	if g, err := s.Volume(ctx, "idle"); err != nil || !reflect.DeepEqual(g, idle) {
		t.Fatalf("Volume(idle) = %+v, %v; want %+v", g, err, idle)
	}
}

func TestStore_Open_LockedInProcess(t *testing.T) {
	path := storePath(t)
	first := openT(t, path, Config{})
	_ = first

	_, err := Open(path, Config{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open: %v, want ErrInUse", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "in use by another csiactor agent") || !strings.Contains(msg, filepath.Dir(path)) {
		t.Fatalf("second Open error %q should say the data dir is in use and name it", msg)
	}
}

func TestStore_Open_LockedByAnotherProcess(t *testing.T) {
	path := storePath(t)
	release := holdInChild(t, path, 0)

	_, err := Open(path, Config{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrInUse) {
		t.Errorf("Open while another process holds the store: %v, want ErrInUse", err)
	}

	release()
	// The lock went with the process: the store opens now.
	openT(t, path, Config{LockTimeout: 200 * time.Millisecond})
}

// writeStore creates a store at path with n volumes and closes it.
func writeStore(t *testing.T, path string, n int) {
	t.Helper()
	ctx := ctxT(t)
	s := openT(t, path, Config{NoSync: true})
	for i := range n {
		if err := s.PutVolume(ctx, volumeWithClaim(fmt.Sprintf("vol-%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStore_Open_Corrupt(t *testing.T) {
	checkLeaks(t)
	garbage := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + 13)
		}
		return b
	}
	tests := []struct {
		name   string
		verify bool
		// make turns a valid store at path (with 500 volumes) into a bad one.
		make func(t *testing.T, path string)
	}{
		{"garbage small", false, func(t *testing.T, path string) {
			if err := os.WriteFile(path, garbage(100), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage large", false, func(t *testing.T, path string) {
			if err := os.WriteFile(path, garbage(1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to half", false, func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to 5000 bytes", false, func(t *testing.T, path string) {
			if err := os.Truncate(path, 5000); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to 100 bytes", false, func(t *testing.T, path string) {
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		}},
		{"both meta pages damaged", false, func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, off := range []int64{16, 4096 + 16} {
				if _, err := f.WriteAt(garbage(64), off); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"data pages damaged, verify on open", true, func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			// Leaf pages only, which Open reads only with VerifyOnOpen.
			for off := fi.Size() / 4 / 4096 * 4096; off < fi.Size()/2; off += 4096 {
				if _, err := f.WriteAt(garbage(32), off); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"freelist page damaged", false, func(t *testing.T, path string) {
			off := freelistOffset(t, path)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(garbage(32), off); err != nil {
				t.Fatal(err)
			}
		}},
		{"bbolt file of another program", false, func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("other"))
				if err != nil {
					return err
				}
				return b.Put([]byte("k"), []byte("v"))
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"schema version missing", false, func(t *testing.T, path string) {
			editBolt(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(bucketMeta)).Delete([]byte(keySchemaVersion))
			})
		}},
		{"volumes bucket missing", false, func(t *testing.T, path string) {
			editBolt(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(bucketVolumes)) })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := storePath(t)
			writeStore(t, path, 500)
			tt.make(t, path)
			before := readFile(t, path)

			s, err := Open(path, Config{VerifyOnOpen: tt.verify, LockTimeout: 100 * time.Millisecond})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open of a corrupt store succeeded")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			t.Logf("Open: %v", err)
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			assertUnchanged(t, path, before)

			// The failed Open released the file: the next failure is the
			// same ErrCorrupt, not ErrInUse.
			if _, err := Open(path, Config{VerifyOnOpen: tt.verify, LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("second Open: %v, want ErrCorrupt", err)
			}
			assertUnchanged(t, path, before)
		})
	}
}

// freelistOffset returns the file offset of the freelist page of the
// bbolt file at path.
func freelistOffset(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var off int64 = -1
	err = db.View(func(tx *bolt.Tx) error {
		for id := 2; off < 0; id++ {
			p, err := tx.Page(id)
			if err != nil {
				return err
			}
			if p == nil {
				return fmt.Errorf("no freelist page in %d pages", id)
			}
			if p.Type == "freelist" {
				off = int64(id) * int64(db.Info().PageSize)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return off
}

func setSchemaVersion(t *testing.T, path string, v uint64) {
	t.Helper()
	editBolt(t, path, func(tx *bolt.Tx) error {
		var raw [8]byte
		binary.BigEndian.PutUint64(raw[:], v)
		return tx.Bucket([]byte(bucketMeta)).Put([]byte(keySchemaVersion), raw[:])
	})
}

func schemaVersion(t *testing.T, path string) uint64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) error {
		v = binary.BigEndian.Uint64(tx.Bucket([]byte(bucketMeta)).Get([]byte(keySchemaVersion)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStore_Open_NewFileGetsCurrentSchema(t *testing.T) {
	path := storePath(t)
	s := openT(t, path, Config{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if v := schemaVersion(t, path); v != SchemaVersion {
		t.Fatalf("schema version %d, want %d", v, SchemaVersion)
	}
}

func TestStore_Open_EmptyFileIsNew(t *testing.T) {
	path := storePath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := openT(t, path, Config{})
	if _, err := s.PutAllocation(ctxT(t), Allocation{ID: "a"}); err != nil {
		t.Fatal(err)
	}
}

func TestStore_Open_SchemaTooNew(t *testing.T) {
	path := storePath(t)
	writeStore(t, path, 10)
	setSchemaVersion(t, path, SchemaVersion+1)
	before := readFile(t, path)

	_, err := Open(path, Config{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open: %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(SchemaVersion+1)) {
		t.Errorf("error %q should name the file's version", err)
	}
	assertUnchanged(t, path, before)
}

func TestStore_Open_MigratesOlderSchema(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	writeStore(t, path, 3)

	// A build one schema version ahead, whose migration adds a bucket.
	ran := 0
	next := currentSchema()
	next.version = SchemaVersion + 1
	next.buckets = append(next.buckets, "extra")
	next.migrations[SchemaVersion] = func(tx *bolt.Tx) error {
		ran++
		_, err := tx.CreateBucket([]byte("extra"))
		return err
	}
	s, err := open(path, Config{}, next)
	if err != nil {
		t.Fatalf("open with the next schema: %v", err)
	}
	if vols, err := s.ActiveVolumes(ctx); err != nil || len(vols) != 3 {
		t.Fatalf("ActiveVolumes after migration: %d volumes, %v; want 3", len(vols), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatalf("migration ran %d times, want 1", ran)
	}
	if v := schemaVersion(t, path); v != SchemaVersion+1 {
		t.Fatalf("schema version after migration %d, want %d", v, SchemaVersion+1)
	}

	// Reopening at that version does not migrate again.
	s, err = open(path, Config{}, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatalf("migration ran again on reopen (%d runs)", ran)
	}

	// And this build refuses the migrated file.
	if _, err := Open(path, Config{}); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open of the migrated file: %v, want ErrSchemaTooNew", err)
	}
}

func TestStore_Open_FailedMigrationChangesNothing(t *testing.T) {
	path := storePath(t)
	writeStore(t, path, 3)
	next := currentSchema()
	next.version = SchemaVersion + 1
	boom := errors.New("boom")
	next.migrations[SchemaVersion] = func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("half-done")); err != nil {
			return err
		}
		return boom
	}
	if _, err := open(path, Config{}, next); !errors.Is(err, boom) {
		t.Fatalf("open: %v, want the migration's error", err)
	}
	if v := schemaVersion(t, path); v != SchemaVersion {
		t.Fatalf("schema version %d after a failed migration, want %d", v, SchemaVersion)
	}
	s := openT(t, path, Config{})
	if ids, err := s.VolumeIDs(ctxT(t)); err != nil || len(ids) != 3 {
		t.Fatalf("VolumeIDs: %v, %v; want 3 ids", ids, err)
	}
}

func TestStore_Close_Idempotent(t *testing.T) {
	checkLeaks(t)
	s := openT(t, storePath(t), Config{})
	for i := range 3 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
}

func TestStore_Close_ThenEveryMethodFails(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"PutAllocation":    func() error { _, err := s.PutAllocation(ctx, Allocation{ID: "a"}); return err },
		"DeleteAllocation": func() error { return s.DeleteAllocation(ctx, "a") },
		"Allocation":       func() error { _, err := s.Allocation(ctx, "a"); return err },
		"Allocations":      func() error { _, err := s.Allocations(ctx); return err },
		"PutVolume":        func() error { return s.PutVolume(ctx, Volume{ID: "v"}) },
		"DeleteVolume":     func() error { return s.DeleteVolume(ctx, "v") },
		"Volume":           func() error { _, err := s.Volume(ctx, "v"); return err },
		"ForEachVolume":    func() error { return s.ForEachVolume(ctx, func(Volume) error { return nil }) },
		"VolumeIDs":        func() error { _, err := s.VolumeIDs(ctx); return err },
		"ActiveVolumes":    func() error { _, err := s.ActiveVolumes(ctx); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestStore_Close_DrainsQueuedWrites(t *testing.T) {
	for _, tt := range writeQueues {
		t.Run(tt.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			path := storePath(t)
			s := openT(t, path, Config{MaxBatchDelay: time.Hour})
			// Hold the commit lock so the writes below queue.
			release := tt.block(s, t)
			const n = 20
			errs := make(chan error, n)
			for i := range n {
				go func() { errs <- tt.write(ctx, s, fmt.Sprintf("v%02d", i)) }()
			}
			waitQueued(t, tt.queue(s), n)
			closed := make(chan error, 1)
			go func() { closed <- s.Close() }()
			release()
			for range n {
				if err := <-errs; err != nil {
					t.Errorf("queued write: %v", err)
				}
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			s = openT(t, path, Config{})
			ids, err := s.VolumeIDs(ctx)
			if err != nil || len(ids) != n {
				t.Fatalf("after Close and reopen: %d volumes (%v), want %d", len(ids), err, n)
			}
		})
	}
}

func TestStore_Volume_DamagedRecord(t *testing.T) {
	ctx := ctxT(t)
	path := storePath(t)
	writeStore(t, path, 2)
	editBolt(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumes)).Put([]byte("vol-00001"), []byte("{not json"))
	})
	s := openT(t, path, Config{})
	if _, err := s.Volume(ctx, "vol-00001"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "vol-00001") {
		t.Fatalf("Volume of a damaged record: %v, want ErrCorrupt naming the volume", err)
	}
	if _, err := s.Volume(ctx, "vol-00000"); err != nil {
		t.Fatalf("Volume of an intact record: %v", err)
	}
	if _, err := s.ActiveVolumes(ctx); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ActiveVolumes with a damaged record: %v, want ErrCorrupt", err)
	}
}

func TestStore_ActiveVolumes_FileTruncatedWhileOpen(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	writeStore(t, path, 2000)
	s := openT(t, path, Config{})
	// Another program truncates the file under the open store: reading the
	// mapped pages past the new end faults (SIGBUS), which must come back
	// as ErrCorrupt rather than kill the process.
	if err := os.Truncate(path, 2*4096); err != nil {
		t.Fatal(err)
	}
	_, err := s.ActiveVolumes(ctx)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ActiveVolumes on a truncated file: %v, want ErrCorrupt", err)
	}
	t.Logf("ActiveVolumes: %v", err)
}

// TestStore_Open_DamagedDataPages damages leaf pages that Open does not
// read: the damage must surface as ErrCorrupt from the read that meets it,
// never as a crash or as wrong data.
func TestStore_Open_DamagedDataPages(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	writeStore(t, path, 2000)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	// Damage the second quarter of the file: volume leaf pages, away from
	// the meta, root and freelist pages.
	for off := fi.Size() / 4 / 4096 * 4096; off < fi.Size()/2; off += 4096 {
		if _, err := f.WriteAt([]byte("garbage garbage garbage garbage!"), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s := openT(t, path, Config{})
	_, err = s.ActiveVolumes(ctx)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ActiveVolumes over damaged pages: %v, want ErrCorrupt", err)
	}
	t.Logf("ActiveVolumes: %v", err)
}
