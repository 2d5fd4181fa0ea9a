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
// back to back before it runs as many of the other.
const loneChunk = 100

// BenchmarkPutVolumeLone measures the latency of one write when nothing
// else writes: one goroutine rewrites one volume (as a volume actor does
// after each claim step, waiting for each write before the next), in a
// store of loneVolumes volumes, with fsync off and on. One op is one
// write through the journal, appended by the writer itself when no append
// is running: copied into its mapped preallocated segment with fsync off,
// one pwrite(2) into it and an fdatasync with fsync on; reported as
// µs/write. Checkpoints run in the background as they would in an agent,
// and count.
//
// The same run also makes as many writes the ways the store made them
// before: through the journal appended with write(2) to a file that grows
// (plain segments, write-µs/write), and one bbolt transaction each
// (Store.directVolumes, bbolt-µs/write), committed by the writer itself;
// and the other way to append to a preallocated segment (pwrite-µs/write
// with fsync off, mapped-µs/write with it on). All are interleaved in
// chunks on the same store (the other paths' writes, and the checkpoint
// and new segment before each switch, outside the timer), so all see the
// same machine load. ratio is journal time over write(2) journal time;
// bbolt-ratio is journal time over bbolt time.
func BenchmarkPutVolumeLone(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
		alt    segmentKind
	}{{"nosync", true, segmentPwrite}, {"sync", false, segmentMapped}} {
		b.Run(mode.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{NoSync: mode.noSync})
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
			// Only this goroutine writes, and it waits for each write.
			direct := func(n int) time.Duration {
				s.setDirectVolumes(b, true)
				d := put(n)
				s.setDirectVolumes(b, false)
				return d
			}
			kind := func(k segmentKind, n int) time.Duration {
				s.setSegmentKind(b, k)
				d := put(n)
				s.setSegmentKind(b, segmentAuto)
				return d
			}
			direct(loneChunk) // warm every path
			kind(segmentPlain, loneChunk)
			kind(mode.alt, loneChunk)
			put(loneChunk)
			var journal, written, alt, bbolt time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(loneChunk, b.N-done)
				b.StopTimer()
				bbolt += direct(n)
				written += kind(segmentPlain, n)
				alt += kind(mode.alt, n)
				b.StartTimer()
				journal += put(n)
				done += n
			}
			perWrite := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(perWrite(journal), "µs/write")
			b.ReportMetric(perWrite(written), "write-µs/write")
			b.ReportMetric(perWrite(alt), mode.alt.String()+"-µs/write")
			b.ReportMetric(perWrite(bbolt), "bbolt-µs/write")
			b.ReportMetric(float64(journal)/float64(written), "ratio")
			b.ReportMetric(float64(journal)/float64(bbolt), "bbolt-ratio")
		})
	}
}

// BenchmarkPutVolumeLoneSteady is BenchmarkPutVolumeLone without the
// switches, which start each chunk on a new segment: one writer rewrites
// 64 volumes in turn for b.N writes on one store, through generations
// filled, prefaulted and checkpointed as in an agent, with fsync off; the
// journal as it is ("journal": mapped), and on stores of their own in the
// same run, appended with pwrite(2) to a preallocated file
// ("journal-pwrite") and with write(2) to a growing one as before
// ("journal-write"). Each reports µs/write and the slowest write.
func BenchmarkPutVolumeLoneSteady(b *testing.B) {
	for _, k := range []struct {
		name string
		kind segmentKind
	}{{"journal", segmentAuto}, {"journal-pwrite", segmentPwrite}, {"journal-write", segmentPlain}} {
		b.Run(k.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.setSegmentKind(b, k.kind)
			vols := make([]Volume, 64)
			for i := range vols {
				vols[i] = volumeWithClaim(fmt.Sprintf("vol-%06d", i))
			}
			ctx := context.Background()
			var slowest time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				if err := s.PutVolume(ctx, vols[i%len(vols)]); err != nil {
					b.Fatal(err)
				}
				slowest = max(slowest, time.Since(t0))
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/1e3/float64(b.N), "µs/write")
			b.ReportMetric(float64(slowest.Microseconds()), "max-µs")
		})
	}
}
