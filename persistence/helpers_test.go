package persistence

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		holdStore(path)
		return
	}
	if spec := os.Getenv(crashEnv); spec != "" {
		crashWriter(spec)
		return
	}
	leakcheck.VerifyTestMain(m)
}

// checkLeaks fails t if goroutines started during the test outlive it. It
// runs after every later t.Cleanup, so stores closed by openT's cleanup
// are closed by then.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(leakcheck.Check(t))
}

// storePath returns a path for a store file inside a fresh temp dir.
func storePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "data", "state.db")
}

// openT opens path and closes the store when the test ends.
func openT(t testing.TB, path string, cfg Config) *Store {
	t.Helper()
	s, err := Open(path, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b
}

// assertUnchanged fails if the file at path differs from want.
func assertUnchanged(t testing.TB, path string, want []byte) {
	t.Helper()
	if got := readFile(t, path); !bytes.Equal(got, want) {
		t.Fatalf("store file changed: %d bytes before, %d after (or same size, different bytes)", len(want), len(got))
	}
}

// volumeWithClaim returns a volume holding one published claim.
func volumeWithClaim(id string) Volume {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return Volume{
		ID:           id,
		Plugin:       "hostpath",
		ExternalID:   "ext-" + id,
		Capabilities: []Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		MountOptions: &MountOptions{FSType: "ext4"},
		Parameters:   map[string]string{"size": "1Gi"},
		Claims: []Claim{{
			Alloc: "alloc-1", Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system",
			State: "published", Usage: "rw-file-system-single-node-writer",
			TargetPath: "/var/lib/csiactor/volumes/hostpath/per-alloc/alloc-1/" + id + "/rw-file-system-single-node-writer",
			CreatedAt:  now, UpdatedAt: now,
		}},
		Stagings: []Staging{{Usage: "rw-file-system-single-node-writer", Path: "/staging/" + id, Users: []string{"alloc-1"}, Staged: true}},
		Revision: 3, CreatedAt: now, UpdatedAt: now,
	}
}

// testingProcs is GOMAXPROCS, for sizing parallel benchmarks.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
