package persistence

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestStore_PutAllocation_AssignsSeqOnce(t *testing.T) {
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, Config{})
	seqs := map[string]uint64{}
	for _, id := range []string{"zeta", "alpha", "mid"} {
		// The caller's Seq is ignored.
		a, err := s.PutAllocation(ctx, Allocation{ID: id, Plugin: "p", Type: "node", Seq: 999})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = a.Seq
	}
	if seqs["zeta"] != 1 || seqs["alpha"] != 2 || seqs["mid"] != 3 {
		t.Fatalf("first puts got seqs %v, want zeta=1 alpha=2 mid=3", seqs)
	}

	// Re-put in another order, with other fields and seqs: Seq is kept.
	for _, id := range []string{"mid", "alpha", "zeta"} {
		a, err := s.PutAllocation(ctx, Allocation{ID: id, Plugin: "p", Type: "node", Healthy: true, Seq: 1})
		if err != nil {
			t.Fatal(err)
		}
		if a.Seq != seqs[id] || !a.Healthy {
			t.Fatalf("re-put %s returned %+v, want seq %d and the new fields", id, a, seqs[id])
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Across a reopen, and for re-puts after it.
	s = openT(t, path, Config{})
	a, err := s.PutAllocation(ctx, Allocation{ID: "alpha", Plugin: "p", Type: "node"})
	if err != nil || a.Seq != seqs["alpha"] {
		t.Fatalf("re-put after reopen: %+v, %v; want seq %d", a, err, seqs["alpha"])
	}
	b, err := s.PutAllocation(ctx, Allocation{ID: "beta", Plugin: "p", Type: "node"})
	if err != nil || b.Seq != 4 {
		t.Fatalf("new put after reopen: %+v, %v; want seq 4", b, err)
	}
	all, err := s.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, a := range all {
		order = append(order, a.ID)
		if !a.Healthy && a.ID != "alpha" && a.ID != "beta" {
			t.Errorf("allocation %s lost its re-put fields: %+v", a.ID, a)
		}
	}
	if want := []string{"zeta", "alpha", "mid", "beta"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("Allocations order %v, want %v (by Seq)", order, want)
	}
}

func TestStore_DeleteAllocation_ThenPutGetsNewSeq(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	first, err := s.PutAllocation(ctx, Allocation{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutAllocation(ctx, Allocation{ID: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAllocation(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allocation(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Allocation after delete: %v, want ErrNotFound", err)
	}
	again, err := s.PutAllocation(ctx, Allocation{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Seq <= first.Seq || again.Seq != 3 {
		t.Fatalf("re-registered allocation got seq %d, want 3 (newer than b)", again.Seq)
	}
}

func TestStore_DeleteAllocation_UnknownIsNil(t *testing.T) {
	s := openT(t, storePath(t), Config{})
	if err := s.DeleteAllocation(ctxT(t), "nope"); err != nil {
		t.Fatalf("DeleteAllocation(unknown): %v, want nil", err)
	}
}

func TestStore_Allocation_RoundTrip(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	in := Allocation{
		ID: "a1", Plugin: "hostpath", Type: "monolith", Socket: "/run/a1.sock",
		Command: []string{"/bin/p", "--endpoint={endpoint}"}, Env: map[string]string{"X": "1"},
		PID: 42, PIDStart: 1234, Healthy: true, HealthMsg: "ok",
		Provider: "hostpath.csi.k8s.io", Version: "1.2.3", NodeID: "n1", ControllerRequired: true,
	}
	stored, err := s.PutAllocation(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	// The returned record does not share the caller's slices and maps.
	in.Command[0] = "changed"
	in.Env["X"] = "changed"
	if stored.Command[0] != "/bin/p" || stored.Env["X"] != "1" {
		t.Fatalf("returned record aliases the caller's slices/maps: %+v", stored)
	}
	got, err := s.Allocation(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, stored) {
		t.Fatalf("Allocation:\n got %+v\nwant %+v", got, stored)
	}
	if _, err := s.Allocation(ctx, "other"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "other") {
		t.Fatalf("Allocation(unknown): %v, want ErrNotFound naming the id", err)
	}
}

func TestStore_PutAllocation_InvalidID(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	tests := []struct {
		name string
		id   string
	}{
		{"empty", ""},
		{"too long", strings.Repeat("x", 32769)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.PutAllocation(ctx, Allocation{ID: tt.id})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "allocation id") {
				t.Fatalf("PutAllocation: %v, want ErrInvalid naming the field", err)
			}
			if _, err := s.Allocation(ctx, tt.id); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Allocation: %v, want ErrInvalid", err)
			}
			if err := s.DeleteAllocation(ctx, tt.id); !errors.Is(err, ErrInvalid) {
				t.Fatalf("DeleteAllocation: %v, want ErrInvalid", err)
			}
		})
	}
	if all, err := s.Allocations(ctx); err != nil || len(all) != 0 {
		t.Fatalf("Allocations after rejected puts: %v, %v; want none", all, err)
	}
}
