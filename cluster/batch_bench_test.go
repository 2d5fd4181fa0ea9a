package cluster_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/runtime"
)

// batchVolumesEnv sets how many volumes BenchmarkRegisterBatch registers
// (default 10,000, so that `make bench` stays short; the campaign uses
// 100,000).
const batchVolumesEnv = "CSIACTOR_BATCH_VOLUMES"

// BenchmarkRegisterBatch registers CSIACTOR_BATCH_VOLUMES volumes (default
// 10,000) through POST /v1/volumes/batch, runtime.MaxBatchVolumes per
// request, sent one after the other by an api.Client over the agent's
// unix socket, on one agent with a fake plugin (a monolith allocation
// that answers ValidateVolumeCapabilities for each new volume) and the
// store synced (one fdatasync per batch): "local" without a cluster,
// "cluster" in cluster mode on a single-member embedded etcd (definitions
// written 128 per transaction). Each iteration starts a fresh agent (and
// etcd) outside the timer. It reports:
//
//   - s/op: the time until the last batch is answered;
//   - volumes/s: volumes registered per second;
//   - s/100k-volumes: that rate scaled to 100,000 volumes;
//   - cpu-s/100k-volumes: the CPU time (user and system) the process
//     spent meanwhile, the agent, the fake plugin and the embedded etcd
//     together, scaled to 100,000 volumes: what the registration costs
//     whatever else the machine runs.
//
// Every volume is checked registered (and, in cluster mode, in etcd)
// after the timer stops.
//
//	CSIACTOR_BATCH_VOLUMES=100000 go test -run '^$' -bench RegisterBatch -benchtime 1x ./cluster/
func BenchmarkRegisterBatch(b *testing.B) {
	n := 10000
	if v := os.Getenv(batchVolumesEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a positive number", batchVolumesEnv, v)
		}
	}
	for _, mode := range []string{"local", "cluster"} {
		b.Run(mode, func(b *testing.B) {
			var elapsed, cpu time.Duration
			for range b.N {
				b.StopTimer()
				wall, used := registerBatchOnce(b, mode, n)
				elapsed, cpu = elapsed+wall, cpu+used
			}
			b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "volumes/s")
			b.ReportMetric(elapsed.Seconds()/float64(b.N)*100000/float64(n), "s/100k-volumes")
			b.ReportMetric(cpu.Seconds()/float64(b.N)*100000/float64(n), "cpu-s/100k-volumes")
		})
	}
}

// registerBatchOnce starts an agent in mode, registers n volumes on it in
// batches with the timer running, checks them, and returns the time the
// registration took and the CPU time the process used meanwhile.
func registerBatchOnce(b *testing.B, mode string, n int) (wall, cpu time.Duration) {
	endpoint := "http://unused"
	if mode == "cluster" {
		endpoint = etcdtest.Start(b).Endpoint()
	}
	cfg := clusterConfig(b, "n1", endpoint)
	cfg.Store.NoSync = false
	if mode == "local" {
		cfg.Cluster = nil
	}
	a := startAgentWith(b, "n1", cfg)
	c, err := api.NewClient(serveAPI(b, a.rt))
	if err != nil {
		b.Fatal(err)
	}
	entries := make([]runtime.CreateVolumeSpec, n)
	for i := range entries {
		id := fmt.Sprintf("vol-%06d", i)
		entries[i] = runtime.CreateVolumeSpec{ID: id, VolumeSpec: volSpec(id, "single-node-writer")}
	}
	ctx := context.Background()
	b.StartTimer()
	start, cpuStart := time.Now(), processCPU(b)
	for lo := 0; lo < n; lo += runtime.MaxBatchVolumes {
		res, err := c.RegisterVolumes(ctx, entries[lo:min(lo+runtime.MaxBatchVolumes, n)])
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			if r.Status != runtime.BatchRegistered {
				b.Fatalf("volume %s: %s: %s", r.ID, r.Status, r.Error)
			}
		}
	}
	elapsed, used := time.Since(start), processCPU(b)-cpuStart
	b.StopTimer()
	vs, err := a.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil || len(vs) != n {
		b.Fatalf("%d volumes registered (%v), want %d", len(vs), err, n)
	}
	if mode == "cluster" {
		if got := etcdKeys(b, endpoint, runtime.DefaultClusterPrefix+"/volumes/"); got != int64(n) {
			b.Fatalf("etcd holds %d volume definitions, want %d", got, n)
		}
	}
	a.stop()
	return elapsed, used
}

// processCPU returns the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
