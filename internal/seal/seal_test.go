package seal_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/seal"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, seal.KeySize) }

func mustNew(t *testing.T, cur []byte, prev ...[]byte) *seal.Keyring {
	t.Helper()
	k, err := seal.New(cur, prev...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyring_SealOpen_RoundTrip(t *testing.T) {
	k := mustNew(t, testKey(1))
	const secret = "hunter2-very-secret"
	s := k.Seal("volume/v1", "password", secret)
	if strings.Contains(s, secret) {
		t.Fatalf("sealed value %q contains the secret", s)
	}
	if want := "v1:" + seal.KeyID(testKey(1)) + ":"; !strings.HasPrefix(s, want) {
		t.Errorf("sealed value %q does not start with %q", s, want)
	}
	if s2 := k.Seal("volume/v1", "password", secret); s2 == s {
		t.Error("two seals of one value are equal: the nonce is not random")
	}
	got, err := k.Open("volume/v1", "password", s)
	if err != nil || got != secret {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Empty values seal too.
	if got, err := k.Open("r", "n", k.Seal("r", "n", "")); err != nil || got != "" {
		t.Errorf("empty value: %q, %v", got, err)
	}
}

func TestKeyring_Open_BoundToRecordAndName(t *testing.T) {
	k := mustNew(t, testKey(1))
	s := k.Seal("volume/v1", "password", "hunter2")
	for _, tt := range []struct{ record, name string }{
		{"volume/v2", "password"}, {"volume/v1", "token"}, {"snapshot/v1", "password"},
	} {
		_, err := k.Open(tt.record, tt.name, s)
		if !errors.Is(err, seal.ErrOpen) {
			t.Errorf("Open(%s, %s) of a value sealed for volume/v1 password: %v, want ErrOpen", tt.record, tt.name, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error names the value: %v", err)
		}
	}
	// A damaged value.
	b := []byte(s)
	b[len(b)-3] ^= 1
	if _, err := k.Open("volume/v1", "password", string(b)); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("damaged: %v, want ErrOpen", err)
	}
	for _, bad := range []string{"", "hunter2", "v1:abc:xyz", "v2:" + seal.KeyID(testKey(1)) + ":AAAA", "v1:" + seal.KeyID(testKey(1)) + ":!!"} {
		if _, err := k.Open("volume/v1", "password", bad); !errors.Is(err, seal.ErrOpen) {
			t.Errorf("Open(%q): %v, want ErrOpen", bad, err)
		}
	}
}

func TestKeyring_Open_Rotation(t *testing.T) {
	old := mustNew(t, testKey(1))
	s := old.Seal("volume/v1", "password", "hunter2")

	rotated := mustNew(t, testKey(2), testKey(1))
	if got, err := rotated.Open("volume/v1", "password", s); err != nil || got != "hunter2" {
		t.Fatalf("previous key: %q, %v", got, err)
	}
	if n := rotated.Stale(map[string]string{"a": s, "b": rotated.Seal("volume/v1", "b", "x")}); n != 1 {
		t.Errorf("Stale = %d, want 1", n)
	}

	dropped := mustNew(t, testKey(2))
	_, err := dropped.Open("volume/v1", "password", s)
	if !errors.Is(err, seal.ErrUnknownKey) {
		t.Fatalf("dropped key: %v, want ErrUnknownKey", err)
	}
	for _, want := range []string{seal.KeyID(testKey(1)), seal.KeyID(testKey(2)), "secrets.previous_key_files", `"password"`, "volume/v1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	var none *seal.Keyring
	if _, err := none.Open("volume/v1", "password", s); !errors.Is(err, seal.ErrUnknownKey) || !strings.Contains(err.Error(), "secrets.key_file") {
		t.Errorf("nil keyring: %v, want ErrUnknownKey naming secrets.key_file", err)
	}
	if none.Enabled() || none.CurrentID() != "" || none.Stale(map[string]string{"a": s}) != 1 {
		t.Error("a nil keyring must be disabled, with no key ID, and find every value stale")
	}
}

func TestKeyring_Maps(t *testing.T) {
	k := mustNew(t, testKey(3))
	if k.SealMap("r", nil) != nil {
		t.Error("SealMap(nil) is not nil")
	}
	in := map[string]string{"user": "u", "password": "p"}
	sealed := k.SealMap("r", in)
	if len(sealed) != 2 || sealed["user"] == "u" {
		t.Fatalf("SealMap = %v", sealed)
	}
	out, err := k.OpenMap("r", sealed)
	if err != nil || len(out) != 2 || out["user"] != "u" || out["password"] != "p" {
		t.Fatalf("OpenMap = %v, %v", out, err)
	}
	// Values swapped between names do not open.
	sealed["user"], sealed["password"] = sealed["password"], sealed["user"]
	if _, err := k.OpenMap("r", sealed); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("swapped values: %v, want ErrOpen", err)
	}
}

func TestNew_BadKey(t *testing.T) {
	if _, err := seal.New(make([]byte, 16)); !errors.Is(err, seal.ErrKeyFile) {
		t.Errorf("16-byte key: %v", err)
	}
	if _, err := seal.New(testKey(1), make([]byte, 33)); !errors.Is(err, seal.ErrKeyFile) {
		t.Errorf("33-byte previous key: %v", err)
	}
}

func writeKey(t *testing.T, dir, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

func TestReadKeyFile_Cases(t *testing.T) {
	dir := t.TempDir()
	good := writeKey(t, dir, "good", testKey(7), 0o600)
	strict := writeKey(t, dir, "strict", testKey(7), 0o400)
	for _, p := range []string{good, strict} {
		if b, err := seal.ReadKeyFile(p); err != nil || !bytes.Equal(b, testKey(7)) {
			t.Errorf("ReadKeyFile(%s) = %v", p, err)
		}
	}
	for _, tt := range []struct {
		name, path, want string
	}{
		{"short", writeKey(t, dir, "short", testKey(7)[:31], 0o600), "holds 31 bytes, want exactly 32"},
		{"long", writeKey(t, dir, "long", append(testKey(7), '\n'), 0o600), "holds 33 bytes"},
		{"world-readable", writeKey(t, dir, "world", testKey(7), 0o644), "mode 0644: others may read it"},
		{"group-readable", writeKey(t, dir, "group", testKey(7), 0o640), "mode 0640"},
		{"directory", dir, "is not a regular file"},
	} {
		_, err := seal.ReadKeyFile(tt.path)
		if !errors.Is(err, seal.ErrKeyFile) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.path) {
			t.Errorf("%s: %v, want ErrKeyFile naming %s and %q", tt.name, err, tt.path, tt.want)
		}
	}
	if _, err := seal.ReadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	k, err := seal.Load(good, writeKey(t, dir, "old", testKey(8), 0o600))
	if err != nil || k.CurrentID() != seal.KeyID(testKey(7)) {
		t.Fatalf("Load = %v", err)
	}
	if _, err := seal.Load(good, filepath.Join(dir, "short")); !errors.Is(err, seal.ErrKeyFile) {
		t.Errorf("Load with a bad previous key: %v", err)
	}
}

func ExampleKeyring() {
	k, _ := seal.New(bytes.Repeat([]byte{1}, seal.KeySize))
	s := k.Seal("volume/v1", "password", "hunter2")
	v, _ := k.Open("volume/v1", "password", s)
	id, _ := seal.SealedKeyID(s)
	fmt.Println(id == k.CurrentID(), v)
	// Output: true hunter2
}

func TestKeyring_Digest(t *testing.T) {
	k1, err := seal.New(bytes.Repeat([]byte{1}, seal.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	k2, err := seal.New(bytes.Repeat([]byte{2}, seal.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{"user": "admin", "token": "s3cret"}
	d := k1.Digest("r", m)
	if d == "" || d != k1.Digest("r", map[string]string{"token": "s3cret", "user": "admin"}) {
		t.Fatalf("digest of equal maps differs: %q", d)
	}
	for what, other := range map[string]string{
		"value":  k1.Digest("r", map[string]string{"user": "admin", "token": "other"}),
		"name":   k1.Digest("r", map[string]string{"user": "admin", "tokens": "s3cret"}),
		"record": k1.Digest("r2", m),
		"key":    k2.Digest("r", m),
		"split":  k1.Digest("r", map[string]string{"user": "admintoken", "": "s3cret"}),
	} {
		if other == d {
			t.Errorf("another %s gives the same digest", what)
		}
	}
	if strings.Contains(d, "s3cret") || k1.Digest("r", nil) != "" {
		t.Errorf("digest %q", d)
	}
}
