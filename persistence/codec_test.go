package persistence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestVolumeCodec_CoversRecords(t *testing.T) {
	if got := recordShape(reflect.TypeFor[Volume]()); got != volumeCodecShape {
		t.Fatalf("records.go changed: the store writes volumes as JSON until codec.go encodes the new fields "+
			"(append them at the end of their type) and volumeCodecShape is set to:\n%q", got)
	}
}

// fillAll sets every field reachable from v to a non-zero value, so a
// round trip proves the codec keeps every field, including ones added
// to records.go later.
func fillAll(v reflect.Value, seed string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(seed)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(-int64(len(seed)) * 1000003)
	case reflect.Uint64:
		v.SetUint(uint64(len(seed)) * 1 << 40)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := range 3 {
			m.SetMapIndex(reflect.ValueOf(fmt.Sprintf("%s-k%d", seed, i)), reflect.ValueOf(fmt.Sprintf("%s-v%d", seed, i)))
		}
		v.Set(m)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fillAll(s.Index(i), fmt.Sprintf("%s[%d]", seed, i))
		}
		v.Set(s)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillAll(p.Elem(), seed)
		v.Set(p)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2024, 2, 29, 23, 59, 58, len(seed), time.FixedZone("", 5*3600+30*60))))
			return
		}
		for i := range v.NumField() {
			fillAll(v.Field(i), seed+"."+v.Type().Field(i).Name)
		}
	default:
		panic("fillAll: add kind " + v.Kind().String())
	}
}

func TestVolumeCodec_RoundTrip(t *testing.T) {
	var full Volume
	fillAll(reflect.ValueOf(&full).Elem(), "v")
	local := volumeWithClaim("local")
	local.CreatedAt = time.Date(2023, 6, 1, 12, 0, 0, 123456789, time.Local)
	tests := []struct {
		name string
		v    Volume
	}{
		{"zero", Volume{}},
		{"id only", Volume{ID: "v"}},
		{"every field set", full},
		{"typical", volumeWithClaim("vol-1")},
		{"local time", local},
		{"unicode and empty strings", Volume{ID: "vøl ☃", Plugin: "", Parameters: map[string]string{"": "", "ключ": "значение"}, MountOptions: &MountOptions{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := appendVolume(nil, &tt.v)
			var got Volume
			if err := decodeVolumeValue(data, &got, nil); err != nil {
				t.Fatalf("decode: %v", err)
			}
			// The binary form must decode to what a JSON round trip gives
			// (times compared as instant and offset), so the two forms are
			// interchangeable.
			js, err := json.Marshal(&tt.v)
			if err != nil {
				t.Fatal(err)
			}
			var want Volume
			if err := decodeVolumeValue(js, &want, nil); err != nil {
				t.Fatal(err)
			}
			if normalizeTimes(got) != normalizeTimes(want) {
				t.Fatalf("binary round trip:\n got %s\nwant %s", normalizeTimes(got), normalizeTimes(want))
			}
			if tt.name != "local time" && !reflect.DeepEqual(got, want) {
				t.Fatalf("binary round trip:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestVolumeCodec_OlderRecordLeavesNewFieldsZero(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	// A record written before Expansion existed ends after UpdatedAt.
	updated := created.Add(time.Hour)
	// The fields after UpdatedAt take a byte each when zero: the
	// expansion and accessible topology counts, node_expand_pending,
	// secrets_from, ephemeral, claim_mount_flags, mutable_parameters,
	// modifying.
	const afterUpdated = 8
	rec := appendVolume(nil, &Volume{ID: "v", Revision: 9, CreatedAt: created, UpdatedAt: updated})
	rec = rec[:len(rec)-afterUpdated]
	var old Volume
	if err := decodeVolumeBinary(rec, &old); err != nil {
		t.Fatalf("decode record without an expansion: %v", err)
	}
	if old.ID != "v" || !old.UpdatedAt.Equal(updated) || old.Expansion != nil || old.Ephemeral != "" {
		t.Fatalf("decoded %+v", old)
	}

	// A record written before UpdatedAt existed ends after CreatedAt.
	rec = appendVolume(nil, &Volume{ID: "v", Revision: 9, CreatedAt: created})
	rec = rec[:len(rec)-afterUpdated-len(appendTime(nil, time.Time{}))]
	var got Volume
	if err := decodeVolumeBinary(rec, &got); err != nil {
		t.Fatalf("decode record without its last field: %v", err)
	}
	if got.ID != "v" || got.Revision != 9 || !got.CreatedAt.Equal(created) || !got.UpdatedAt.IsZero() {
		t.Fatalf("decoded %+v", got)
	}

	// A claim sub-record written when Claim had only Alloc and Mode.
	short := appendSub(nil, func(dst []byte) []byte {
		dst = appendString(dst, "alloc-1")
		return appendString(dst, "write")
	})
	rec = appendVolume(nil, &Volume{ID: "v"})
	// Volume{ID: "v"}: format, id (2 bytes), then one byte per empty
	// field up to the claims count at offset 14.
	const claimsAt = 14
	if rec[claimsAt] != 0 || rec[claimsAt+1] != 0 || rec[claimsAt+2] != 0 {
		t.Fatal("layout changed: update this test")
	}
	spliced := append(append(append([]byte{}, rec[:claimsAt]...), 1), short...)
	spliced = append(spliced, rec[claimsAt+1:]...)
	if err := decodeVolumeBinary(spliced, &got); err != nil {
		t.Fatalf("decode record with a short claim: %v", err)
	}
	want := []Claim{{Alloc: "alloc-1", Mode: "write"}}
	if !reflect.DeepEqual(got.Claims, want) || got.ID != "v" {
		t.Fatalf("short claim decoded as %+v, want %+v", got.Claims, want)
	}
}

func TestVolumeCodec_Malformed(t *testing.T) {
	good := appendVolume(nil, func() *Volume { v := volumeWithClaim("v"); return &v }())
	tests := []struct {
		name string
		data []byte
	}{
		{"huge string length", append([]byte{volumeFormatBinary}, 0xff, 0xff, 0xff, 0xff, 0x0f)},
		{"varint overflow", append([]byte{volumeFormatBinary}, bytes.Repeat([]byte{0xff}, 11)...)},
		{"cut inside a string", good[:5]},
		{"cut inside a claim", good[:len(good)/2]},
		{"bad bool", append(appendVolume(nil, &Volume{ID: "v"})[:11], 7)}, // created
		{"two mount options", []byte{volumeFormatBinary, 0, 0, 0, 0, 2, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v Volume
			if err := decodeVolumeBinary(tt.data, &v); !errors.Is(err, errMalformed) {
				t.Fatalf("decode: %v, want errMalformed", err)
			}
		})
	}
}

func FuzzDecodeVolumeBinary(f *testing.F) {
	v := volumeWithClaim("v")
	f.Add(appendVolume(nil, &v))
	var full Volume
	fillAll(reflect.ValueOf(&full).Elem(), "f")
	f.Add(appendVolume(nil, &full))
	f.Add([]byte{volumeFormatBinary})
	f.Fuzz(func(t *testing.T, data []byte) {
		data = append([]byte{volumeFormatBinary}, data...)
		var v Volume
		if err := decodeVolumeBinary(data, &v); err != nil {
			return
		}
		// Whatever decodes must survive a round trip.
		var again Volume
		if err := decodeVolumeBinary(appendVolume(nil, &v), &again); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(normalizeTimes(v), normalizeTimes(again)) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", v, again)
		}
	})
}

// normalizeTimes replaces times by their instants, for comparing records
// whose times went through different zones.
func normalizeTimes(v Volume) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestStore_PutVolume_JSONFallback(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, storePath(t), Config{})
	a, b := volumeWithClaim("a"), volumeWithClaim("b")
	s.binaryVolumes = false // as if records.go had a field the codec lacks
	if err := s.PutVolume(ctx, a); err != nil {
		t.Fatal(err)
	}
	s.binaryVolumes = true
	if err := s.PutVolume(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	raw := map[string]byte{}
	if err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumes)).ForEach(func(k, v []byte) error {
			raw[string(k)] = v[0]
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if raw["a"] != '{' || raw["b"] != volumeFormatBinary {
		t.Fatalf("first bytes: a=%q b=%q; want JSON for a and binary for b", raw["a"], raw["b"])
	}
	vols, err := s.ActiveVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 2 || !reflect.DeepEqual(vols[0], a) || !reflect.DeepEqual(vols[1], b) {
		t.Fatalf("ActiveVolumes over mixed forms: %+v", vols)
	}
}
