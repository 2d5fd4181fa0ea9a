package persistence

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// benchWriters is how many goroutines write at once in BenchmarkPutVolume
// (b.SetParallelism(benchWriters/GOMAXPROCS)): many volume actors.
const benchWriters = 64

// benchVolumes is how many distinct volumes the writers cycle through.
const benchVolumes = 10_000

// BenchmarkPutVolume compares, for the same records, 64 writers, fsync
// on and off: PutVolume through the journal as it is ("journal": group
// appends to a preallocated segment, copied into its mapping with fsync
// off, one pwrite(2) and one fdatasync each with it on), through the
// journal appended the other way ("journal-pwrite" with fsync off,
// "journal-mapped" with it on), through the journal appended with
// write(2) to a file that grows, as before it was preallocated
// ("journal-write"), through bbolt group commit as before the journal
// ("group-commit", Store.directVolumes), and one bbolt transaction (and
// one fsync) per write ("update-per-write").
func BenchmarkPutVolume(b *testing.B) {
	vols := make([]Volume, benchVolumes)
	for i := range vols {
		vols[i] = volumeWithClaim(fmt.Sprintf("vol-%05d", i))
	}
	run := func(b *testing.B, noSync, direct bool, kind segmentKind, put func(ctx context.Context, s *Store, v Volume) error) {
		s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{NoSync: noSync})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		s.setSegmentKind(b, kind)
		s.setDirectVolumes(b, direct)
		ctx := context.Background()
		var next atomic.Int64
		b.SetParallelism(max(1, benchWriters/max(1, testingProcs())))
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				v := vols[next.Add(1)%benchVolumes]
				if err := put(ctx, s, v); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
	}
	putVolume := func(ctx context.Context, s *Store, v Volume) error { return s.PutVolume(ctx, v) }
	for _, mode := range []struct {
		name   string
		noSync bool
		alt    segmentKind
	}{{"sync", false, segmentMapped}, {"nosync", true, segmentPwrite}} {
		b.Run(mode.name, func(b *testing.B) {
			b.Run("journal", func(b *testing.B) { run(b, mode.noSync, false, segmentAuto, putVolume) })
			b.Run("journal-"+mode.alt.String(), func(b *testing.B) { run(b, mode.noSync, false, mode.alt, putVolume) })
			b.Run("journal-write", func(b *testing.B) { run(b, mode.noSync, false, segmentPlain, putVolume) })
			b.Run("group-commit", func(b *testing.B) { run(b, mode.noSync, true, segmentAuto, putVolume) })
			b.Run("update-per-write", func(b *testing.B) {
				// The baseline: what PutVolume does, in its own db.Update.
				run(b, mode.noSync, true, segmentAuto, func(_ context.Context, s *Store, v Volume) error {
					data, err := s.encodeVolume(&v)
					if err != nil {
						return err
					}
					key := []byte(v.ID)
					active := v.Active()
					return s.db.Update(func(tx *bolt.Tx) error {
						if err := tx.Bucket([]byte(bucketVolumes)).Put(key, data); err != nil {
							return err
						}
						if active {
							return tx.Bucket([]byte(bucketVolumesWithWork)).Put(key, []byte{})
						}
						return tx.Bucket([]byte(bucketVolumesWithWork)).Delete(key)
					})
				})
			})
		})
	}
}

// writeVolumes fills a new store file at path with n volumes, one claim
// each, in large transactions (setup only), in the binary or JSON form.
func writeVolumes(b *testing.B, path string, n int, binary bool) {
	b.Helper()
	s, err := Open(path, Config{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	s.binaryVolumes = binary
	const chunk = 10_000
	for lo := 0; lo < n; lo += chunk {
		seedVolumes(b, s, lo, min(n, lo+chunk))
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLoad100k opens a store holding 100,000 volumes with one claim
// each and loads them all with ActiveVolumes, as an agent does at
// start-up; reported as ms per open+load (the file is in the page cache,
// as after an agent restart). "json" is the same with every record stored
// as JSON (what the store falls back to), the baseline for the codec.
func BenchmarkLoad100k(b *testing.B) {
	const n = 100_000
	for _, form := range []struct {
		name   string
		binary bool
	}{{"binary", true}, {"json", false}} {
		b.Run(form.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "state.db")
			writeVolumes(b, path, n, form.binary)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			loops := 0
			for b.Loop() {
				loops++
				s, err := Open(path, Config{})
				if err != nil {
					b.Fatal(err)
				}
				vols, err := s.ActiveVolumes(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if len(vols) != n {
					b.Fatalf("loaded %d volumes, want %d", len(vols), n)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(loops), "ms/load")
		})
	}
}

// BenchmarkDecodeVolume compares the binary volume codec with
// encoding/json for one typical record (one claim, one staging).
func BenchmarkDecodeVolume(b *testing.B) {
	v := volumeWithClaim("vol-000001")
	js, err := json.Marshal(&v)
	if err != nil {
		b.Fatal(err)
	}
	bin := appendVolume(nil, &v)
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		b.ReportMetric(float64(len(bin)), "bytes/record")
		for b.Loop() {
			var out Volume
			if err := decodeVolumeValue(bin, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		b.ReportMetric(float64(len(js)), "bytes/record")
		for b.Loop() {
			var out Volume
			if err := decodeVolumeValue(js, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEncodeVolume is BenchmarkDecodeVolume's other half.
func BenchmarkEncodeVolume(b *testing.B) {
	v := volumeWithClaim("vol-000001")
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = appendVolume(make([]byte, 0, 512), &v)
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
