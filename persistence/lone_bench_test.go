package persistence

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// loneVolumes is how many volumes BenchmarkPutVolumeLone's store holds, so
// that its trees have branch pages and its buckets are not inline, as in a
// real agent's store.
const loneVolumes = 1_000

// loneChunk is how many writes of one path BenchmarkPutVolumeLone runs
// back to back before it runs as many of each other.
const loneChunk = 100

// BenchmarkPutVolumeLone is the latency of one durable write (fsync on)
// when nothing else writes, idle and loaded: one goroutine rewrites one
// volume, waiting for each write, as a volume actor does at a claim's
// intent and outcome. One op is one write as the store makes it: appended
// to the journal by its committer goroutine (µs/write).
// The same run makes as many writes each of the baselines' ways, on the
// same store, interleaved in chunks (their switches outside the timer), so
// that all see the same machine:
//
//   - bbolt-µs/write: one bbolt transaction each (the baseline of the
//     journal).
//
// Checkpoints run in the background as in an agent, and count.
func BenchmarkPutVolumeLone(b *testing.B) {
	forLoads(b, func(b *testing.B) {
		s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		seedVolumes(b, s, 0, loneVolumes)
		v := volumeWithClaim(fmt.Sprintf("vol-%06d", loneVolumes/2))
		ctx := context.Background()
		put := func(n int) time.Duration {
			start := time.Now()
			for range n {
				v.Revision++
				if err := s.PutVolume(ctx, v); err != nil {
					b.Fatal(err)
				}
			}
			return time.Since(start)
		}
		baselines := []struct {
			name       string
			set, reset func()
			total      time.Duration
		}{
			{name: "bbolt", set: func() { s.setDirectVolumes(b, true) }, reset: func() { s.setDirectVolumes(b, false) }},
		}
		for i := range baselines { // warm every path
			baselines[i].set()
			put(loneChunk)
			baselines[i].reset()
		}
		put(loneChunk)
		var journal time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; {
			n := min(loneChunk, b.N-done)
			b.StopTimer()
			for i := range baselines {
				bl := &baselines[i]
				bl.set()
				bl.total += put(n)
				bl.reset()
			}
			b.StartTimer()
			journal += put(n)
			done += n
		}
		perWrite := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
		b.ReportMetric(perWrite(journal), "µs/write")
		for _, bl := range baselines {
			b.ReportMetric(perWrite(bl.total), bl.name+"-µs/write")
		}
	})
}
