//go:build linux && (amd64 || arm64)

package persistence

import (
	"context"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// busyWork is the CPU a writer of BenchmarkPutVolumeBusyWriters spends
// between two writes: the checksum of this many bytes, about 100 µs on a
// 2-core host of this project's CI, of the order of what the agent spends
// on one claim step (its RPC and bookkeeping).
const busyWork = 1 << 20

// BenchmarkPutVolumeBusyWriters runs 64 writers that each compute for a
// while between two PutVolume calls, fsync on, as volume actors do between
// the steps they persist: the journal syncing through AIO ("aio") against
// the same journal syncing with a blocking fdatasync ("fdatasync", the
// baseline). A goroutine in fdatasync keeps its P, so with back-to-back
// syncs the writers' computing gets fewer cores; "cores" is the CPU time
// the process used per second of the run.
func BenchmarkPutVolumeBusyWriters(b *testing.B) {
	vols := make([]Volume, benchVolumes)
	for i := range vols {
		vols[i] = volumeWithClaim(fmt.Sprintf("vol-%05d", i))
	}
	work := make([]byte, busyWork)
	for _, mode := range []struct {
		name string
		aio  bool
	}{{"aio", true}, {"fdatasync", false}} {
		b.Run(mode.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "state.db"), Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.setAIOSync(b, mode.aio)
			ctx := context.Background()
			var next atomic.Int64
			var sink atomic.Uint32
			b.SetParallelism(max(1, benchWriters/max(1, testingProcs())))
			b.ResetTimer()
			start, cpu0 := time.Now(), processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					sink.Add(crc32.ChecksumIEEE(work))
					if err := s.PutVolume(ctx, vols[next.Add(1)%benchVolumes]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			wall := time.Since(start)
			b.ReportMetric(float64(b.N)/wall.Seconds(), "writes/s")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(wall), "cores")
		})
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
