package persistence

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestStore_PutVolumes_OneGroupSurvivesCrash(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			ctx := ctxT(t)
			path := storePath(t)
			s, err := Open(path, noAutoCheckpoint)
			if err != nil {
				t.Fatal(err)
			}
			s.setDirectVolumes(t, direct)
			var vs []Volume
			for i := range 300 {
				v := Volume{ID: fmt.Sprintf("v%03d", i), Plugin: "p", ExternalID: fmt.Sprintf("ext-%d", i)}
				if i%100 == 0 {
					v = volumeWithClaim(v.ID) // active ones keep the index
				}
				vs = append(vs, v)
			}
			if err := s.PutVolumes(ctx, vs); err != nil {
				t.Fatal(err)
			}
			if !direct {
				if got := s.j.group; got != 1 {
					t.Fatalf("journal groups after one PutVolumes = %d, want 1", got)
				}
			}
			crash(t, s)
			s = openT(t, path, Config{})
			for _, want := range vs {
				got, err := s.Volume(ctx, want.ID)
				if err != nil {
					t.Fatalf("after the crash: %v", err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("volume %s after the crash:\n got %+v\nwant %+v", want.ID, got, want)
				}
			}
			if got, want := activeIDs(t, s), []string{"v000", "v100", "v200"}; !reflect.DeepEqual(got, want) {
				t.Fatalf("active volumes %v, want %v", got, want)
			}
		})
	}
}

func TestStore_PutVolumes_RefusedWritesNothing(t *testing.T) {
	tests := []struct {
		name string
		vs   []Volume
		want string
	}{
		{"empty id", []Volume{{ID: "a"}, {ID: ""}}, "volume id is empty"},
		{"twice", []Volume{{ID: "a"}, {ID: "b"}, {ID: "a"}}, `volume "a" given twice`},
		{"long id", []Volume{{ID: "a"}, {ID: strings.Repeat("x", 40000)}}, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, storePath(t), Config{})
			err := s.PutVolumes(ctx, tt.vs)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("PutVolumes: %v, want ErrInvalid with %q", err, tt.want)
			}
			ids, err := s.VolumeIDs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != 0 {
				t.Fatalf("refused PutVolumes wrote %v", ids)
			}
		})
	}
	s := openT(t, storePath(t), Config{})
	if err := s.PutVolumes(ctxT(t), nil); err != nil {
		t.Fatalf("PutVolumes(nil): %v", err)
	}
}
