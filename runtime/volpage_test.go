package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_VolumesPage_Local: in local mode the pages walk the store in
// ID order: every volume there before the listing is in exactly one page
// while others are registered meanwhile, the plugin filter pages too, and
// the last page has no next token; Volumes still answers everything.
func TestRuntime_VolumesPage_Local(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n, am = 95, "single-node-writer"
	for i := range n {
		id := fmt.Sprintf("l%03d", i)
		spec := volSpecFor(id, am)
		if i%3 == 0 {
			spec.Plugin = "other"
		}
		if _, err := e.rt.RegisterVolume(ctx, id, spec); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range []string{fmt.Sprintf("a%03d", i), fmt.Sprintf("l%03d-x", i), fmt.Sprintf("z%03d", i)} {
				if _, err := e.rt.RegisterVolume(ctx, id, volSpecFor(id, am)); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	seen := map[string]int{}
	for token := ""; ; {
		vs, next, err := e.rt.VolumesPage(ctx, runtime.VolumeFilter{}, 7, token)
		if err != nil {
			t.Fatal(err)
		}
		if len(vs) > 7 || (next != "" && len(vs) != 7) {
			t.Fatalf("page of %d volumes with next token %q, want 7 (fewer only on the last)", len(vs), next)
		}
		for _, v := range vs {
			seen[v.ID]++
		}
		if next == "" {
			break
		}
		token = next
	}
	close(stop)
	wg.Wait()
	for i := range n {
		if id := fmt.Sprintf("l%03d", i); seen[id] != 1 {
			t.Errorf("%s seen %d times, want once", id, seen[id])
		}
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s seen %d times", id, k)
		}
	}

	// The plugin filter: 32 of the 95 are of "other".
	var other []string
	for token := ""; ; {
		vs, next, err := e.rt.VolumesPage(ctx, runtime.VolumeFilter{Plugin: "other"}, 5, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if v.Plugin != "other" {
				t.Fatalf("%s of plugin %s in a listing of plugin other", v.ID, v.Plugin)
			}
			other = append(other, v.ID)
		}
		if next == "" {
			break
		}
		token = next
	}
	if len(other) != 32 {
		t.Errorf("plugin other listed %d volumes, want 32", len(other))
	}
	all, err := e.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil || len(all) < len(seen) {
		t.Fatalf("Volumes = %d volumes, %v; want at least the %d paged", len(all), err, len(seen))
	}

	for _, bad := range []struct {
		per          int
		token, field string
	}{
		{0, "", "per_page"}, {-3, "", "per_page"}, {runtime.MaxVolumesPerPage + 1, "", "per_page"},
		{5, "a/b", "next_token"}, {5, strings.Repeat("x", runtime.MaxIDLength+1), "next_token"},
	} {
		_, _, err := e.rt.VolumesPage(ctx, runtime.VolumeFilter{}, bad.per, bad.token)
		var fe *runtime.FieldError
		if !errors.As(err, &fe) || fe.Field != bad.field || !errors.Is(err, runtime.ErrInvalid) {
			t.Errorf("VolumesPage(%d, %q) = %v, want ErrInvalid naming %s", bad.per, bad.token, err, bad.field)
		}
	}
}
