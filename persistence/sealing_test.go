package persistence

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/csiactor/csiactor/internal/seal"
)

// secretValue marks every secret of these tests: it must never be found in
// a file.
const secretValue = "s3cr3t-never-on-disk"

func testKeyring(t testing.TB, cur byte, prev ...byte) *seal.Keyring {
	t.Helper()
	var prevKeys [][]byte
	for _, p := range prev {
		prevKeys = append(prevKeys, bytes.Repeat([]byte{p}, seal.KeySize))
	}
	k, err := seal.New(bytes.Repeat([]byte{cur}, seal.KeySize), prevKeys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func volumeWithSecrets(id string) Volume {
	v := volumeWithClaim(id)
	v.Secrets = map[string]string{"password": secretValue + "-" + id, "user": secretValue + "-user"}
	return v
}

func snapshotWithSecrets(id string) Snapshot {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return Snapshot{ID: id, Plugin: "p", SourceVolume: "vol1", State: SnapshotReady,
		Secrets: map[string]string{"token": secretValue + "-" + id}, CreatedAt: now, UpdatedAt: now}
}

// assertNoSecretInDir fails if any file under the store's directory holds
// secretValue.
func assertNoSecretInDir(t *testing.T, path string) {
	t.Helper()
	n := 0
	for name, data := range dirFiles(t, filepath.Dir(path)) {
		n++
		if bytes.Contains(data, []byte(secretValue)) {
			t.Errorf("%s holds a secret in clear", name)
		}
	}
	if n == 0 {
		t.Fatal("no file to look at")
	}
}

// rawValues returns the stored values of bucket, read from the file with
// bbolt read-only (the store must be closed).
func rawValues(t *testing.T, path, bucket string) map[string][]byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string][]byte{}
	if err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucket)).ForEach(func(k, v []byte) error {
			out[string(k)] = bytes.Clone(v)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStore_Sealing_NoSecretOnDisk(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	keys := testKeyring(t, 1)
	s, err := Open(path, Config{Keyring: keys})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(ctx, volumeWithSecrets("vol1")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolumeDeferred(ctx, volumeWithSecrets("vol2")); err != nil {
		t.Fatal(err)
	}
	// JSON volumes, written when the codec does not cover the record.
	s.binaryVolumes = false
	if err := s.PutVolume(ctx, volumeWithSecrets("vol3")); err != nil {
		t.Fatal(err)
	}
	s.binaryVolumes = true
	if err := s.PutSnapshot(ctx, snapshotWithSecrets("snap1")); err != nil {
		t.Fatal(err)
	}
	// In memory and on reads, secrets are in clear.
	for _, id := range []string{"vol1", "vol2", "vol3"} {
		v, err := s.Volume(ctx, id)
		if err != nil || v.Secrets["password"] != secretValue+"-"+id {
			t.Fatalf("Volume(%s) secrets = %v, %v", id, v.Secrets, err)
		}
	}
	// The journal holds vol1 and vol3 sealed.
	if js := journalPaths(t, path); len(js) == 0 {
		t.Fatal("no journal: the journaled write was not looked at")
	}
	assertNoSecretInDir(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoSecretInDir(t, path)
	vols := rawValues(t, path, bucketVolumes)
	if vols["vol1"][0] != volumeFormatBinarySealed || vols["vol2"][0] != volumeFormatBinarySealed {
		t.Errorf("binary volumes start with %#x and %#x, want the sealed format %#x", vols["vol1"][0], vols["vol2"][0], volumeFormatBinarySealed)
	}
	if !bytes.Contains(vols["vol3"], []byte(`"sealed_secrets":{`)) || bytes.Contains(vols["vol3"], []byte(`"secrets"`)) {
		t.Errorf("JSON volume = %s, want sealed_secrets only", vols["vol3"])
	}
	if sn := rawValues(t, path, bucketSnapshots)["snap1"]; !bytes.Contains(sn, []byte(`"sealed_secrets":{"token":"v1:`+keys.CurrentID()+`:`)) {
		t.Errorf("snapshot = %s, want its secret sealed with key %s", sn, keys.CurrentID())
	}

	s = openT(t, path, Config{Keyring: keys})
	for _, id := range []string{"vol1", "vol2", "vol3"} {
		v, err := s.Volume(ctx, id)
		if err != nil || v.Secrets["password"] != secretValue+"-"+id || v.Secrets["user"] != secretValue+"-user" {
			t.Fatalf("Volume(%s) after reopen: secrets %v, %v", id, v.Secrets, err)
		}
	}
	active, err := s.ActiveVolumes(ctx)
	if err != nil || len(active) != 3 || active[0].Secrets["password"] != secretValue+"-vol1" {
		t.Fatalf("ActiveVolumes after reopen = %d volumes, %v", len(active), err)
	}
	sn, err := s.Snapshot(ctx, "snap1")
	if err != nil || sn.Secrets["token"] != secretValue+"-snap1" {
		t.Fatalf("Snapshot after reopen: %v, %v", sn.Secrets, err)
	}
	// Volumes without secrets are stored as before.
	if err := s.PutVolume(ctx, volumeWithClaim("plain")); err != nil {
		t.Fatal(err)
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := s.view(ctx, func(tx *bolt.Tx) error {
		raw = bytes.Clone(tx.Bucket([]byte(bucketVolumes)).Get([]byte("plain")))
		return nil
	}); err != nil || raw[0] != volumeFormatBinary {
		t.Errorf("a volume without secrets: format %#x, %v; want %#x", raw[0], err, volumeFormatBinary)
	}
}

// A store written in clear is read with a key set, and Reseal seals it.
func TestStore_Reseal_SealsPlainRecords(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	s, err := Open(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range resealChunk + 10 { // more than one chunk
		if err := s.PutVolume(ctx, volumeWithSecrets(fmt.Sprintf("vol%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutVolume(ctx, volumeWithClaim("nosecrets")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(ctx, snapshotWithSecrets("snap1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reseal(ctx); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Reseal without a keyring: %v, want ErrInvalidConfig", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if b := readFile(t, path); !bytes.Contains(b, []byte(secretValue)) {
		t.Fatal("the store without a key holds no secret: the test proves nothing")
	}

	keys := testKeyring(t, 1)
	s, err = Open(path, Config{Keyring: keys})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Volume(ctx, "vol001"); err != nil || v.Secrets["password"] != secretValue+"-vol001" {
		t.Fatalf("plain record read with a key: %v, %v", v.Secrets, err)
	}
	n, err := s.Reseal(ctx)
	if want := 2*(resealChunk+10) + 1; err != nil || n != want {
		t.Fatalf("Reseal = %d, %v; want %d", n, err, want)
	}
	if n, err := s.Reseal(ctx); err != nil || n != 0 {
		t.Errorf("second Reseal = %d, %v; want 0", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// bbolt keeps freed pages: compact what Reseal left behind before
	// looking, as an attacker with the file would not.
	compacted := filepath.Join(t.TempDir(), "compact.db")
	compact(t, path, compacted)
	if b := readFile(t, compacted); bytes.Contains(b, []byte(secretValue)) {
		t.Error("a secret is in clear in the live pages after Reseal")
	}
	s = openT(t, path, Config{Keyring: keys})
	if v, err := s.Volume(ctx, "vol265"); err != nil || v.Secrets["password"] != secretValue+"-vol265" {
		t.Fatalf("after Reseal: %v, %v", v.Secrets, err)
	}
	if sn, err := s.Snapshot(ctx, "snap1"); err != nil || sn.Secrets["token"] != secretValue+"-snap1" {
		t.Fatalf("snapshot after Reseal: %v, %v", sn.Secrets, err)
	}
}

// compact copies the live pages of the store at src into dst.
func compact(t *testing.T, src, dst string) {
	t.Helper()
	from, err := bolt.Open(src, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer from.Close()
	to, err := bolt.Open(dst, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer to.Close()
	if err := bolt.Compact(to, from, 0); err != nil {
		t.Fatal(err)
	}
}

// Rotation: the old key opens until Reseal; then it can be dropped. A
// value sealed with a key the keyring lacks is a clear error.
func TestStore_Reseal_Rotation(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	old := testKeyring(t, 1)
	s, err := Open(path, Config{Keyring: old})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(ctx, volumeWithSecrets("vol1")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(ctx, snapshotWithSecrets("snap1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The new key alone: the old values do not open, by key ID.
	s, err = Open(path, Config{Keyring: testKeyring(t, 2)})
	if err == nil {
		_, err = s.ActiveVolumes(ctx)
		if cerr := s.Close(); cerr != nil {
			t.Fatal(cerr)
		}
	}
	checkUnknownKey(t, "ActiveVolumes", err, old.CurrentID())
	s, err = Open(path, Config{Keyring: testKeyring(t, 2)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Volume(ctx, "vol1")
	checkUnknownKey(t, "Volume", err, old.CurrentID())
	_, err = s.Snapshot(ctx, "snap1")
	checkUnknownKey(t, "Snapshot", err, old.CurrentID())
	_, err = s.Reseal(ctx)
	checkUnknownKey(t, "Reseal", err, old.CurrentID())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Without a key at all, the error says to set one.
	s, err = Open(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Volume(ctx, "vol1")
	checkUnknownKey(t, "Volume without a key", err, old.CurrentID())
	if err == nil || !strings.Contains(err.Error(), "no secrets.key_file is set") {
		t.Errorf("without a key: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// New and previous: reads open, Reseal moves everything to the new key.
	rotated := testKeyring(t, 2, 1)
	s, err = Open(path, Config{Keyring: rotated})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Volume(ctx, "vol1"); err != nil || v.Secrets["password"] != secretValue+"-vol1" {
		t.Fatalf("with the previous key: %v, %v", v.Secrets, err)
	}
	if n, err := s.Reseal(ctx); err != nil || n != 3 {
		t.Fatalf("Reseal = %d, %v; want 3", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{Keyring: testKeyring(t, 2)})
	if v, err := s.Volume(ctx, "vol1"); err != nil || v.Secrets["password"] != secretValue+"-vol1" {
		t.Fatalf("old key dropped after Reseal: %v, %v", v.Secrets, err)
	}
	if sn, err := s.Snapshot(ctx, "snap1"); err != nil || sn.Secrets["token"] != secretValue+"-snap1" {
		t.Fatalf("old key dropped after Reseal: snapshot %v, %v", sn.Secrets, err)
	}
}

func checkUnknownKey(t *testing.T, what string, err error, keyID string) {
	t.Helper()
	if !errors.Is(err, seal.ErrUnknownKey) || errors.Is(err, ErrCorrupt) {
		t.Errorf("%s: %v, want seal.ErrUnknownKey (not ErrCorrupt)", what, err)
		return
	}
	if !strings.Contains(err.Error(), keyID) || strings.Contains(err.Error(), secretValue) {
		t.Errorf("%s: %q, want the key ID %s named and no secret value", what, err, keyID)
	}
}

// Writes that race with Reseal are never undone by it.
func TestStore_Reseal_ConcurrentWrites(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	path := storePath(t)
	const vols, revs = 50, 20
	// Sealed with the previous key, so that Reseal has work to do.
	s, err := Open(path, Config{Keyring: testKeyring(t, 1)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range vols {
		if err := s.PutVolume(ctx, volumeWithSecrets(fmt.Sprintf("vol%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{Keyring: testKeyring(t, 2, 1)})
	var wg sync.WaitGroup
	errs := make(chan error, vols)
	for i := range vols {
		wg.Go(func() {
			v := volumeWithSecrets(fmt.Sprintf("vol%02d", i))
			for r := range revs {
				v.Revision = uint64(100 + r)
				v.Secrets["password"] = fmt.Sprintf("%s-%d", secretValue, r)
				if err := s.PutVolume(ctx, v); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	if _, err := s.Reseal(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := s.Reseal(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range vols {
		v, err := s.Volume(ctx, fmt.Sprintf("vol%02d", i))
		if err != nil || v.Revision != 100+revs-1 || v.Secrets["password"] != fmt.Sprintf("%s-%d", secretValue, revs-1) {
			t.Fatalf("vol%02d after Reseal and writes: revision %d, %v", i, v.Revision, err)
		}
	}
}
