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

// loneChunk is how many writes of one path BenchmarkPutVolumeLone runs
// back to back before it runs as many of the other.
const loneChunk = 100

// BenchmarkPutVolumeLone measures the latency of one write when nothing
// else writes: one goroutine rewrites one volume (as a volume actor does
// after each claim step, waiting for each write before the next), in a
// store of loneVolumes volumes, with fsync off and on. One op is one
// write by the current path, where the writer commits its own write when
// no commit is running; reported as µs/write.
//
// The same run also makes as many writes by the store's earlier path
// (hand-off-µs/write), where every write is handed to the committer
// goroutine, which hands the result back: the baseline. The two are
// interleaved in chunks on the same store (the hand-off writes outside the
// timer), so both see the same machine load; ratio is lead time over
// hand-off time.
func BenchmarkPutVolumeLone(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"nosync", true}, {"sync", false}} {
		b.Run(mode.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{NoSync: mode.noSync})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			seedVolumes(b, s, loneVolumes)
			v := volumeWithClaim(fmt.Sprintf("vol-%06d", loneVolumes/2))
			ctx := context.Background()
			put := func(n int, handOff bool) time.Duration {
				// Only this goroutine writes, and it waits for each write:
				// no commit runs while handOff changes.
				s.handOff = handOff
				start := time.Now()
				for range n {
					v.Revision++
					if err := s.PutVolume(ctx, v); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			put(loneChunk, true) // warm both paths
			put(loneChunk, false)
			var lead, handOff time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(loneChunk, b.N-done)
				b.StopTimer()
				handOff += put(n, true)
				b.StartTimer()
				lead += put(n, false)
				done += n
			}
			b.ReportMetric(float64(lead.Nanoseconds())/1e3/float64(b.N), "µs/write")
			b.ReportMetric(float64(handOff.Nanoseconds())/1e3/float64(b.N), "hand-off-µs/write")
			b.ReportMetric(float64(lead)/float64(handOff), "ratio")
		})
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
