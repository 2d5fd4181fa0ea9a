package persistence

import (
	"errors"
	"strings"
	"testing"
)

func TestStore_BootID_RoundTripAndReopen(t *testing.T) {
	path := storePath(t)
	s, err := Open(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if id, err := s.BootID(ctx); err != nil || id != "" {
		t.Fatalf("BootID of a new store = %q, %v; want \"\", nil", id, err)
	}
	const boot = "0b6e1c3c-5f55-4b8e-9a0e-1d2f3a4b5c6d"
	if err := s.PutBootID(ctx, boot); err != nil {
		t.Fatalf("PutBootID: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	if id, err := s.BootID(ctx); err != nil || id != boot {
		t.Fatalf("BootID after reopen = %q, %v; want %q", id, err, boot)
	}
}

func TestStore_PutBootID_BadInputChangesNothing(t *testing.T) {
	s := openT(t, storePath(t), Config{})
	ctx := ctxT(t)
	if err := s.PutBootID(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a b", "a\nb", strings.Repeat("x", MaxBootIDLen+1)} {
		if err := s.PutBootID(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("PutBootID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if id, _ := s.BootID(ctx); id != "first" {
		t.Errorf("BootID after refused puts = %q, want \"first\"", id)
	}
}
