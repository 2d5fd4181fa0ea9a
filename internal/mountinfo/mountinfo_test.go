package mountinfo

import (
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
