package api_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// withUmask runs f with the process umask set to mask. The umask is
// process-wide, so these tests do not run in parallel.
func withUmask(mask int, f func()) {
	old := syscall.Umask(mask)
	defer syscall.Umask(old)
	f()
}

func socketMode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		t.Fatalf("%s is not a socket: %s", path, fi.Mode())
	}
	return fi.Mode().Perm()
}

func TestListenUnix_Mode0600_EvenWithUmask0(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api.sock")
	var l net.Listener
	var err error
	withUmask(0, func() { l, err = api.ListenUnix(path) })
	if err != nil {
		t.Fatal(err)
	}
	if m := socketMode(t, path); m != 0o600 {
		t.Errorf("socket mode %04o, want 0600", m)
	}
	// Nothing is left beside it (the temporary bind directory is gone).
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "api.sock" {
		t.Errorf("directory holds %v, want only api.sock", ents)
	}
	// It serves at path.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the renamed socket: %v", err)
	}
	c.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file still there after Close: %v", err)
	}
}

// When the temporary bind path would be too long, the umask path is used,
// with the same result.
func TestListenUnix_LongPath_Mode0600(t *testing.T) {
	dir := t.TempDir()
	name := strings.Repeat("s", runtime.MaxSocketPathLength-len(dir)-1)
	path := filepath.Join(dir, name)
	if len(path) != runtime.MaxSocketPathLength {
		t.Fatalf("test path is %d bytes", len(path))
	}
	var l net.Listener
	var err error
	after := -1
	withUmask(0, func() {
		l, err = api.ListenUnix(path)
		after = syscall.Umask(0) // what ListenUnix left behind
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if m := socketMode(t, path); m != 0o600 {
		t.Errorf("socket mode %04o, want 0600", m)
	}
	if after != 0 {
		t.Errorf("ListenUnix left the umask at %04o, want it restored to 0", after)
	}
}

func TestListenUnix_StaleSocket_Replaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close() // leaves a socket file nobody answers on
	l, err := api.ListenUnix(path)
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	defer l.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestListenUnix_LiveSocket_InUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	first, err := api.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = api.ListenUnix(path)
	if !errors.Is(err, api.ErrAddressInUse) || !strings.Contains(err.Error(), path) {
		t.Errorf("second ListenUnix = %v, want ErrAddressInUse naming the path", err)
	}
	// The first listener's socket is untouched.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("first listener lost its socket: %v", err)
	}
	c.Close()
}

func TestListenUnix_Errors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ListenUnix(file); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("ListenUnix over a file = %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Error("the file was touched")
	}
	if _, err := api.ListenUnix("relative.sock"); !errors.Is(err, runtime.ErrInvalid) {
		t.Errorf("ListenUnix(relative) = %v", err)
	}
	if _, err := api.ListenUnix("/" + strings.Repeat("x", 200)); !errors.Is(err, runtime.ErrInvalid) {
		t.Errorf("ListenUnix(long) = %v", err)
	}
	// A missing parent is created, private.
	nested := filepath.Join(dir, "run", "api.sock")
	l, err := api.ListenUnix(nested)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	fi, err := os.Stat(filepath.Dir(nested))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("parent dir: %v %v", fi.Mode(), err)
	}
}

// Close does not remove a socket that something else put at the path since.
func TestListenUnix_Close_KeepsReplacement(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	l, err := api.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("Close removed a file it did not create: %v", err)
	}
}

func TestReadTokenFile_Cases(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok, err := api.ReadTokenFile(write("good", "  s3cret-tok\n", 0o600))
	if err != nil || tok != "s3cret-tok" {
		t.Errorf("ReadTokenFile(good) = %q, %v", tok, err)
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"open", "s3cret-tok", 0o644, "lets group or others read it"},
		{"empty", " \n", 0o600, "is empty"},
		{"two", "s3cret-tok other", 0o600, "one line without spaces"},
	} {
		_, err := api.ReadTokenFile(write(tc.name, tc.content, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadTokenFile(%s) = %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %q shows the token", err)
		}
	}
	if _, err := api.ReadTokenFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadTokenFile(missing) = %v", err)
	}
}
