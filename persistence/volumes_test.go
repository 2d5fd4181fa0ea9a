package persistence

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestVolume_Active(t *testing.T) {
	tests := []struct {
		name string
		v    Volume
		want bool
	}{
		{"idle", Volume{ID: "v"}, false},
		{"claim", Volume{Claims: []Claim{{Alloc: "a"}}}, true},
		{"past claim", Volume{PastClaims: []Claim{{Alloc: "a", State: "taken"}}}, true},
		{"controller published", Volume{ControllerPublished: true}, true},
		{"staged", Volume{Stagings: []Staging{{Usage: "u", Staged: true}}}, true},
		{"staging with users", Volume{Stagings: []Staging{{Usage: "u", Users: []string{"a"}}}}, true},
		{"unused staging", Volume{Stagings: []Staging{{Usage: "u"}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.v.Active(); got != tt.want {
				t.Fatalf("Active() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestStore_PutVolume_RoundTrip(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	v := volumeWithClaim("v1")
	v.Secrets = map[string]string{"password": "hunter2"}
	v.PublishContext = map[string]string{"device": "/dev/x"}
	if err := s.PutVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	got, err := s.Volume(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("Volume:\n got %+v\nwant %+v", got, v)
	}
	// Nothing is bumped by the store.
	if got.Revision != v.Revision || !got.UpdatedAt.Equal(v.UpdatedAt) {
		t.Fatalf("store changed Revision/UpdatedAt: %d %s", got.Revision, got.UpdatedAt)
	}
	if _, err := s.Volume(ctx, "nope"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Volume(unknown): %v, want ErrNotFound naming the id", err)
	}
}

func TestStore_PutVolume_InvalidID(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	for _, id := range []string{"", strings.Repeat("v", 40000)} {
		if err := s.PutVolume(ctx, Volume{ID: id}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "volume id") {
			t.Fatalf("PutVolume(%d-byte id): %v, want ErrInvalid naming the field", len(id), err)
		}
		if err := s.DeleteVolume(ctx, id); !errors.Is(err, ErrInvalid) {
			t.Fatalf("DeleteVolume(%d-byte id): %v, want ErrInvalid", len(id), err)
		}
		if _, err := s.Volume(ctx, id); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Volume(%d-byte id): %v, want ErrInvalid", len(id), err)
		}
	}
	if ids, err := s.VolumeIDs(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("VolumeIDs after rejected puts: %v, %v", ids, err)
	}
}

func TestStore_ActiveVolumes_FollowsPutAndDelete(t *testing.T) {
	ctx := ctxT(t)
	path := storePath(t)
	s := openT(t, path, Config{})
	for i := range 10 {
		v := Volume{ID: fmt.Sprintf("v%d", i)}
		if i%3 == 0 {
			v = volumeWithClaim(v.ID)
		}
		if err := s.PutVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := activeIDs(t, s), []string{"v0", "v3", "v6", "v9"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ActiveVolumes %v, want %v", got, want)
	}

	// v3 is released and freed: no longer active. v4 gets a past claim.
	if err := s.PutVolume(ctx, Volume{ID: "v3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(ctx, Volume{ID: "v4", PastClaims: []Claim{{Alloc: "a", State: "taken"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "v6"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "never-stored"); err != nil {
		t.Fatalf("DeleteVolume(unknown): %v, want nil", err)
	}
	want := []string{"v0", "v4", "v9"}
	if got := activeIDs(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("ActiveVolumes %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path, Config{})
	if got := activeIDs(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("ActiveVolumes after reopen %v, want %v", got, want)
	}
	ids, err := s.VolumeIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"v0", "v1", "v2", "v3", "v4", "v5", "v7", "v8", "v9"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("VolumeIDs %v, want %v", ids, want)
	}
}

func TestStore_ForEachVolume_AllInOrder(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{NoSync: true})
	const n = 3*forEachChunk + 7 // several chunks and a partial one
	for i := range n {
		if err := s.PutVolume(ctx, Volume{ID: fmt.Sprintf("v%04d", i), Plugin: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	err := s.ForEachVolume(ctx, func(v Volume) error {
		seen = append(seen, v.ID)
		// fn may write to the store: it runs outside any transaction.
		if v.ID == "v0100" {
			return s.PutVolume(ctx, volumeWithClaim(v.ID))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("ForEachVolume saw %d volumes, want %d", len(seen), n)
	}
	for i, id := range seen {
		if want := fmt.Sprintf("v%04d", i); id != want {
			t.Fatalf("ForEachVolume #%d is %s, want %s", i, id, want)
		}
	}
	if got := activeIDs(t, s); !reflect.DeepEqual(got, []string{"v0100"}) {
		t.Fatalf("write from inside fn: ActiveVolumes %v, want [v0100]", got)
	}
}

func TestStore_ForEachVolume_StopsAtError(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	for i := range 5 {
		if err := s.PutVolume(ctx, Volume{ID: fmt.Sprintf("v%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := s.ForEachVolume(ctx, func(v Volume) error {
		calls++
		if v.ID == "v2" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("ForEachVolume: %v after %d calls, want stop after 3", err, calls)
	}
}

func TestStore_ForEachVolume_Empty(t *testing.T) {
	s := openT(t, storePath(t), Config{})
	err := s.ForEachVolume(ctxT(t), func(Volume) error {
		t.Fatal("fn called on an empty store")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
