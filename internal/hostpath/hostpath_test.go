package hostpath

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csiactor/csiactor/persistence"
)

func TestDiff_NamesWhatNoClaimOwnsAndWhatIsMissing(t *testing.T) {
	state, data := t.TempDir(), t.TempDir()
	target := filepath.Join(data, "t1")
	staging := filepath.Join(data, "s1")
	stray := filepath.Join(data, "t2")
	body := `{"Volumes":[
	  {"VolID":"id1","VolName":"v1","Attached":true,"Staged":["` + staging + `"],"Published":["` + target + `","` + target + `"]},
	  {"VolID":"id2","VolName":"v2","Attached":true,"Staged":[],"Published":["` + stray + `"]}]}`
	if err := os.WriteFile(filepath.Join(state, "state.json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var w Want
	w.Add("id1", []persistence.Claim{{State: "published", TargetPath: target, StagingPath: staging, ControllerRequired: true}})
	w.Add("id3", []persistence.Claim{{State: "reserved", TargetPath: "/nowhere"}})
	got := Diff(state, data, w)
	want := []string{
		"driver: " + target + " published twice",
		"driver: volume v2 (id2) attached, no claim owns it",
		"driver: volume v2 published at " + stray + ", no claim owns it",
		"mount table: " + target + " not mounted, a claim owns it",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Diff:\n got %q\nwant %q", got, want)
	}
}

func TestDiff_EmptyAgrees(t *testing.T) {
	if d := Diff(t.TempDir(), t.TempDir(), Want{}); len(d) != 0 {
		t.Fatalf("an empty driver and mount table with no claims: %q", d)
	}
}
