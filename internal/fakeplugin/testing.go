package fakeplugin

import (
	"os"
	"path/filepath"
	"testing"
)

// SocketPath returns a fresh socket path in a short temporary directory
// that is removed when t ends. t.TempDir is not used: its paths, built from
// the test name, easily exceed the 107-byte unix socket limit.
func SocketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fakecsi-")
	if err != nil {
		t.Fatalf("fakeplugin: %s", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "csi.sock")
}

// Start serves a new Plugin with cfg on a fresh socket (see SocketPath) and
// stops it when t ends. It returns the plugin and its endpoint,
// "unix:///tmp/fakecsi-…/csi.sock".
func Start(t testing.TB, cfg Config) (*Plugin, string) {
	t.Helper()
	path := SocketPath(t)
	p := New(cfg)
	if err := p.Serve(path); err != nil {
		t.Fatalf("fakeplugin: %s", err)
	}
	t.Cleanup(p.Stop)
	return p, "unix://" + path
}
