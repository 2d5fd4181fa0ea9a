package persistence

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/csiactor/csiactor/internal/testbin"
)

// benchWriters is how many goroutines write at once in BenchmarkPutVolume
// (b.SetParallelism(benchWriters/GOMAXPROCS)): many volume actors.
const benchWriters = 64

// benchVolumes is how many distinct volumes the writers cycle through.
const benchVolumes = 10_000

// forLoads runs bench twice: "idle", and "loaded" beside a CPU hog of
// GOMAXPROCS spinning processes, as on a host busy with other work. Each
// store piece is kept only where it wins in both.
func forLoads(b *testing.B, bench func(b *testing.B)) {
	b.Run("idle", bench)
	b.Run("loaded", func(b *testing.B) {
		testbin.CPUHog(b, runtime.GOMAXPROCS(0))
		bench(b)
	})
}

// BenchmarkPutVolume is durable write throughput (fsync on) of 64 writers
// on 10,000 volumes, idle and loaded, the store as it is beside the
// baseline of each of its pieces, each on a store of its own in the same
// run:
//
//   - journal: appends to the write-ahead journal, group commit (one
//     pwrite(2) and one fdatasync for every write queued behind a running
//     append);
//   - journal-one-per-sync: the same with MaxBatchSize 1 (the baseline of
//     group commit);
//   - bbolt: no journal, each batch of queued writes one bbolt
//     transaction (the baseline of the journal);
//   - bbolt-per-write: one db.Update per write, bbolt alone.
func BenchmarkPutVolume(b *testing.B) {
	vols := make([]Volume, benchVolumes)
	for i := range vols {
		vols[i] = volumeWithClaim(fmt.Sprintf("vol-%05d", i))
	}
	type variant struct {
		name   string
		cfg    Config
		direct bool
		put    func(ctx context.Context, s *Store, v Volume) error
	}
	putVolume := func(ctx context.Context, s *Store, v Volume) error { return s.PutVolume(ctx, v) }
	perWrite := func(_ context.Context, s *Store, v Volume) error {
		data, err := s.encodeVolume(&v)
		if err != nil {
			return err
		}
		key, active := []byte(v.ID), v.Active()
		return s.db.Update(func(tx *bolt.Tx) error { return putVolumeTx(tx, v.ID, key, data, active) })
	}
	variants := []variant{
		{name: "journal", put: putVolume},
		{name: "journal-one-per-sync", cfg: Config{MaxBatchSize: 1}, put: putVolume},
		{name: "bbolt", direct: true, put: putVolume},
		{name: "bbolt-per-write", direct: true, put: perWrite},
	}
	forLoads(b, func(b *testing.B) {
		for _, vt := range variants {
			b.Run(vt.name, func(b *testing.B) {
				s, err := Open(filepath.Join(b.TempDir(), "state.db"), vt.cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				s.setDirectVolumes(b, vt.direct)
				ctx := context.Background()
				var next atomic.Int64
				b.SetParallelism(max(1, benchWriters/max(1, testingProcs())))
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := vt.put(ctx, s, vols[next.Add(1)%benchVolumes]); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
			})
		}
	})
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
// encoding/json for one typical record (one claim, one staging), idle and
// loaded.
func BenchmarkDecodeVolume(b *testing.B) {
	v := volumeWithClaim("vol-000001")
	js, err := json.Marshal(&v)
	if err != nil {
		b.Fatal(err)
	}
	bin := appendVolume(nil, &v)
	forLoads(b, func(b *testing.B) {
		for _, f := range []struct {
			name string
			data []byte
		}{{"binary", bin}, {"json", js}} {
			b.Run(f.name, func(b *testing.B) {
				b.ReportAllocs()
				b.ReportMetric(float64(len(f.data)), "bytes/record")
				for b.Loop() {
					var out Volume
					if err := decodeVolumeValue(f.data, &out, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}

// BenchmarkEncodeVolume is BenchmarkDecodeVolume's other half.
func BenchmarkEncodeVolume(b *testing.B) {
	v := volumeWithClaim("vol-000001")
	forLoads(b, func(b *testing.B) {
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
	})
}
