package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/csiactor/csiactor/internal/atomicfile"
)

func TestWrite_ReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, want := range []string{"one", "two"} {
		if err := atomicfile.Write(p, []byte(want)); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Errorf("%d files in the directory, want 1 (no temp file left)", len(es))
	}
	if err := atomicfile.Write(filepath.Join(dir, "missing", "x"), nil); err == nil {
		t.Error("Write into a missing directory succeeded")
	}
}
