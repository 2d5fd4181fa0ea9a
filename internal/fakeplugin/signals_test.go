package fakeplugin

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestRecordSignals_RecordsEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signals")
	r, err := RecordSignals(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	<-r.First()
	r.Close(0)
	got, err := ReadSignals(path)
	if err != nil || !slices.Equal(got, []string{"SIGHUP"}) {
		t.Fatalf("ReadSignals = %q, %v; want [SIGHUP]", got, err)
	}
	if got, err := ReadSignals(filepath.Join(t.TempDir(), "none")); err != nil || got != nil {
		t.Errorf("ReadSignals of a missing file = %q, %v; want none", got, err)
	}
}
