package mountinfo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain/path`:         "/plain/path",
		`/with\040space`:      "/with space",
		`/tab\011and\134back`: "/tab\tand\\back",
		`/trailing\04`:        `/trailing\04`,
		`/not\9octal`:         `/not\9octal`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder_NestedDeepestFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	src := t.TempDir()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outer := filepath.Join(dir, "a b") // an escaped name in mountinfo
	inner := filepath.Join(outer, "inner")
	for _, m := range []string{outer, inner} {
		if err := os.MkdirAll(m, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(src, m, "", syscall.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount %s: %v", m, err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(m, syscall.MNT_DETACH) })
		if err := os.MkdirAll(inner, 0o700); err != nil { // inside the outer mount, i.e. in src
			t.Fatal(err)
		}
	}
	got, err := Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{inner, outer}) {
		t.Errorf("Under(%s) = %q, want [%s %s]", dir, got, inner, outer)
	}
	if !IsMountPoint(outer) || IsMountPoint(dir) {
		t.Errorf("IsMountPoint(outer) = %v, IsMountPoint(dir) = %v; want true, false", IsMountPoint(outer), IsMountPoint(dir))
	}
}

func TestTable_Has_FromFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mountinfo")
	table := "22 1 0:21 / /data rw - ext4 /dev/sda1 rw\n" +
		"30 22 0:21 /vol /data/volumes/p/per-alloc/a/v/rw\\040x rw - ext4 /dev/sda1 rw\n" +
		"31 22 0:21 /vol /elsewhere rw - ext4 /dev/sda1 rw\n" +
		"short line\n"
	if err := os.WriteFile(file, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	tb, err := Read(file, "/data/volumes")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"/data/volumes/p/per-alloc/a/v/rw x":  true,
		"/data/volumes/p/per-alloc/a/v/rw x/": true, // cleaned
		"/data/volumes/p/per-alloc/a/v":       false,
		"/data":                               false, // outside dir
		"/elsewhere":                          false,
		"":                                    false,
	} {
		if got := tb.Has(path); got != want {
			t.Errorf("Has(%q) = %t, want %t", path, got, want)
		}
	}
	if tb.Len() != 1 {
		t.Errorf("Len = %d, want 1", tb.Len())
	}
	if _, err := Read(filepath.Join(dir, "nosuch"), "/"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing table: %v, want fs.ErrNotExist", err)
	}
}

func TestTable_Has_RealBindMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	src, dir := t.TempDir(), t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(target, syscall.MNT_DETACH)
	tb, err := Read("", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !tb.Has(target) || tb.Has(dir) {
		t.Errorf("Has(target) = %t, Has(dir) = %t; want true, false", tb.Has(target), tb.Has(dir))
	}
}

func TestFSType_RealTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	target := filepath.Join(t.TempDir(), "with space")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if typ, err := FSType(target); err != nil || typ != "" {
		t.Errorf("FSType of a plain directory = %q, %v; want \"\"", typ, err)
	}
	if err := syscall.Mount("none", target, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(target, syscall.MNT_DETACH)
	if typ, err := FSType(target); err != nil || typ != "tmpfs" {
		t.Errorf("FSType of a tmpfs mount = %q, %v; want tmpfs", typ, err)
	}
}
