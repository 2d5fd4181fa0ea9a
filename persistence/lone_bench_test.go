package persistence

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// loneVolumes is how many volumes BenchmarkPutVolumeLone's store holds, so
// that its trees have branch pages and its buckets are not inline, as in a
// real agent's store.
const loneVolumes = 1_000

// BenchmarkPutVolumeLone measures the latency of one write when nothing
// else writes: one goroutine rewrites one volume (as a volume actor does
// after each claim step, waiting for each write before the next), in a
// store of loneVolumes volumes, with fsync off and on. Reported as
// µs/write, for
//
//   - hand-off: the write is queued and committed by the committer
//     goroutine, which hands the result back (the store's earlier path,
//     the baseline);
//   - lead: the writer commits its own write when no commit is running.
func BenchmarkPutVolumeLone(b *testing.B) {
	for _, sync := range []struct {
		name   string
		noSync bool
	}{{"nosync", true}, {"sync", false}} {
		for _, path := range []struct {
			name    string
			handOff bool
		}{{"hand-off", true}, {"lead", false}} {
			b.Run(sync.name+"/"+path.name, func(b *testing.B) {
				s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{NoSync: sync.noSync})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				s.handOff = path.handOff
				seedVolumes(b, s, loneVolumes)
				v := volumeWithClaim(fmt.Sprintf("vol-%06d", loneVolumes/2))
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				n := 0
				for b.Loop() {
					n++
					v.Revision++
					if err := s.PutVolume(ctx, v); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/1e3/float64(n), "µs/write")
			})
		}
	}
}

// seedVolumes puts n volumes with one claim each in one transaction
// (setup only).
func seedVolumes(b *testing.B, s *Store, n int) {
	b.Helper()
	err := s.update(func(tx *bolt.Tx) error {
		for i := range n {
			v := volumeWithClaim(fmt.Sprintf("vol-%06d", i))
			data, err := s.encodeVolume(&v)
			if err != nil {
				return err
			}
			if err := tx.Bucket([]byte(bucketVolumes)).Put([]byte(v.ID), data); err != nil {
				return err
			}
			if err := tx.Bucket([]byte(bucketVolumesWithWork)).Put([]byte(v.ID), []byte{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
