package cluster_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/runtime"
)

// BenchmarkLifecycle is one claim → publish → release → freed through the
// runtime, in local mode and in cluster mode (the claim admitted through
// an embedded etcd on loopback), each with its own fake plugin of the same
// setup, alternating within every iteration so both see the same machine
// load. It reports each mode's time per lifecycle and their ratio
// (cluster-local-ratio); ns/op is the sum of the two. In cluster mode the
// freed claim's removal from etcd runs after the freed event, in the
// background, and is not counted. The agents' data dirs are on tmpfs (see
// benchConfig).
func BenchmarkLifecycle(b *testing.B) {
	srv := etcdtest.Start(b)
	type side struct {
		a      *agent
		events <-chan runtime.Event
		total  time.Duration
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const vol, am = "bench", "single-node-writer"
	var sides []*side
	for _, mode := range []string{"local", "cluster"} {
		cfg := benchConfig(b, "bench-"+mode, srv.Endpoint())
		if mode == "local" {
			cfg.Cluster = nil
		}
		a := startAgentWith(b, "bench-"+mode, cfg)
		defer a.stop()
		if _, err := a.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
			b.Fatal(err)
		}
		events, err := a.rt.Subscribe(ctx)
		if err != nil {
			b.Fatal(err)
		}
		sides = append(sides, &side{a: a, events: events})
	}
	b.ResetTimer()
	for i := range b.N {
		alloc := fmt.Sprintf("a-%d", i)
		for _, s := range sides {
			start := time.Now()
			if _, err := s.a.rt.Claim(ctx, vol, claimReq(alloc, "write", am)); err != nil {
				b.Fatal(err)
			}
			if _, err := s.a.rt.Release(ctx, vol, alloc); err != nil {
				b.Fatal(err)
			}
			for e := range s.events {
				if e.Type == runtime.EventClaimFreed && e.Alloc == alloc {
					break
				}
			}
			s.total += time.Since(start)
		}
	}
	b.StopTimer()
	local, clustered := sides[0].total, sides[1].total
	b.ReportMetric(float64(local.Nanoseconds())/float64(b.N), "local-ns/lifecycle")
	b.ReportMetric(float64(clustered.Nanoseconds())/float64(b.N), "cluster-ns/lifecycle")
	b.ReportMetric(float64(clustered)/float64(local), "cluster-local-ratio")
	cancel()
}

// benchConfig is clusterConfig with the data dir on tmpfs (/dev/shm) when
// there is one, as in the runtime's benchmarks. A lifecycle makes five
// directories (staging and target, the plugin's target included) and
// removes six; on a file system that discards a freed block before the
// removal returns (ext4 without a journal mounted with discard, as on the
// test VMs) each removal waits for the disk: 0.3 ms idle, several under
// load, most of a local lifecycle, and none of it the agent's work. The
// embedded etcd keeps its data on disk, synced, as a real one does.
func benchConfig(b *testing.B, node, endpoint string) runtime.Config {
	b.Helper()
	cfg := clusterConfig(b, node, endpoint)
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "csiactor-cl-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
		cfg.DataDir = dir
	}
	return cfg
}

// throughputVolumes is how many volumes BenchmarkClaimThroughput claims.
const throughputVolumes = 1000

// throughputWorkers is how many claims BenchmarkClaimThroughput keeps in
// flight at once, spread over the agents.
const throughputWorkers = 48

// BenchmarkClaimThroughput is claims per second: each iteration claims
// (and publishes) 1,000 single-node-writer volumes, once through three
// cluster agents on one embedded etcd (volume i through agent i mod 3),
// once through one local agent, each with throughputWorkers claims in
// flight. Only the claims are timed; releasing them and waiting until
// they are freed (in etcd too) is not. It reports cluster-claims/s
// (three agents), local-claims/s (one agent) and their ratio. The agents'
// data dirs are on tmpfs (see benchConfig).
func BenchmarkClaimThroughput(b *testing.B) {
	srv := etcdtest.Start(b)
	ctx := context.Background()
	var clusterAgents []*agent
	for i := 1; i <= 3; i++ {
		node := fmt.Sprintf("tp%d", i)
		a := startAgentWith(b, node, benchConfig(b, node, srv.Endpoint()))
		defer a.stop()
		clusterAgents = append(clusterAgents, a)
	}
	cfg := benchConfig(b, "tp-local", srv.Endpoint())
	cfg.Cluster = nil
	local := startAgentWith(b, "tp-local", cfg)
	defer local.stop()

	const am = "single-node-writer"
	vols := make([]string, throughputVolumes)
	for i := range vols {
		vols[i] = fmt.Sprintf("tp-%04d", i)
		if _, err := clusterAgents[0].rt.RegisterVolume(ctx, vols[i], volSpec(vols[i], am)); err != nil {
			b.Fatal(err)
		}
		if _, err := local.rt.RegisterVolume(ctx, vols[i], volSpec(vols[i], am)); err != nil {
			b.Fatal(err)
		}
	}
	for _, a := range clusterAgents[1:] {
		eventually(b, "every volume on "+a.node, func() (bool, error) {
			vs, err := a.rt.Volumes(ctx, runtime.VolumeFilter{})
			return len(vs) == throughputVolumes, err
		})
	}

	// claimAll claims every volume, volume i through agents[i%len], and
	// returns how long it took.
	claimAll := func(agents []*agent, iter int) time.Duration {
		work := make(chan int)
		var wg sync.WaitGroup
		errs := make(chan error, throughputWorkers)
		start := time.Now()
		for range throughputWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					a := agents[i%len(agents)]
					if _, err := a.rt.Claim(ctx, vols[i], claimReq(fmt.Sprintf("c%d", iter), "write", am)); err != nil {
						errs <- fmt.Errorf("claim %s on %s: %w", vols[i], a.node, err)
						return
					}
				}
			}()
		}
		for i := range vols {
			work <- i
		}
		close(work)
		wg.Wait()
		took := time.Since(start)
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		return took
	}
	// releaseAll releases what claimAll claimed and waits until every
	// claim is freed, on the hosts and in etcd.
	releaseAll := func(agents []*agent, iter int) {
		for i, vol := range vols {
			if _, err := agents[i%len(agents)].rt.Release(ctx, vol, fmt.Sprintf("c%d", iter)); err != nil {
				b.Fatal(err)
			}
		}
		for _, a := range agents {
			eventually(b, "claims freed on "+a.node, func() (bool, error) {
				vs, err := a.rt.Volumes(ctx, runtime.VolumeFilter{})
				for _, v := range vs {
					if len(v.Claims)+len(v.PastClaims) > 0 {
						return false, err
					}
				}
				if err != nil || a.cfg.Cluster == nil {
					return err == nil, err
				}
				ns, err := a.rt.Nodes(ctx)
				for _, n := range ns {
					if n.Claims > 0 {
						return false, err
					}
				}
				return err == nil, err
			})
		}
	}

	var clusterTook, localTook time.Duration
	b.ResetTimer()
	for i := range b.N {
		clusterTook += claimAll(clusterAgents, i)
		localTook += claimAll([]*agent{local}, i)
		b.StopTimer()
		releaseAll(clusterAgents, i)
		releaseAll([]*agent{local}, i)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N * throughputVolumes)
	b.ReportMetric(n/clusterTook.Seconds(), "cluster-claims/s")
	b.ReportMetric(n/localTook.Seconds(), "local-claims/s")
	b.ReportMetric(clusterTook.Seconds()/localTook.Seconds(), "cluster-local-time-ratio")
}
