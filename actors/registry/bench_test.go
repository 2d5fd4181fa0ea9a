package registry

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/csiactor/csiactor/actors/plugin"
)

// manySocketsEnv makes the test binary serve a minimal CSI identity and
// node service on N sockets ("<dir>:<n>"), from one gRPC server, so that a
// benchmark's plugin side runs in another process and its CPU is not
// counted as the agent's.
const manySocketsEnv = "CSIACTOR_TEST_MANY_SOCKETS"

type benchServer struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
}

func (benchServer) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (benchServer) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: "bench.csi", VendorVersion: "1"}, nil
}

func (benchServer) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

func (benchServer) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

func (benchServer) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: "bench-node"}, nil
}

func sockPath(dir string, i int) string { return filepath.Join(dir, "s"+strconv.Itoa(i)+".sock") }

func runManySockets(spec string) int {
	i := len(spec) - 1
	for spec[i] != ':' {
		i--
	}
	dir := spec[:i]
	n, err := strconv.Atoi(spec[i+1:])
	if err != nil {
		return 2
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, benchServer{})
	csipb.RegisterNodeServer(srv, benchServer{})
	for i := range n {
		l, err := net.Listen("unix", sockPath(dir, i))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		go func() { _ = srv.Serve(l) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	fmt.Println("ready")
	<-sig
	srv.Stop()
	return 0
}

// startManySockets runs the many-socket server in a child process.
func startManySockets(b *testing.B, n int) (dir string, stop func()) {
	b.Helper()
	dir = shortDir(b)
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), manySocketsEnv+"="+dir+":"+strconv.Itoa(n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatalf("many-socket server: %q, %v", line, err)
	}
	return dir, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureCPU runs b.N one-second windows and reports the process's CPU
// seconds per wall second.
func measureCPU(b *testing.B) {
	b.Helper()
	b.ResetTimer()
	c0, w0 := cpuTime(), time.Now()
	for range b.N {
		time.Sleep(time.Second)
	}
	c1, w1 := cpuTime(), time.Now()
	b.StopTimer()
	b.ReportMetric((c1-c0).Seconds()/w1.Sub(w0).Seconds(), "cpu-s/wall-s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkHeartbeat measures what keeping 1,000 attached allocations
// fingerprinted every second costs the agent, against a bare gRPC client
// doing the same five RPCs per allocation per second. Use -benchtime=Nx
// (N one-second windows). The plugins run in a child process.
func BenchmarkHeartbeat(b *testing.B) {
	const n = 1000
	dir, stop := startManySockets(b, n)
	defer stop()

	// One registry for every round of the sub-benchmark.
	e := newEnv(b, func(c *Config) {
		c.Log.Logger.SetLevel(logrus.WarnLevel)
		c.Plugin.HeartbeatInterval = time.Second
	})
	for i := range n {
		e.register(plugin.Spec{ID: "a" + strconv.Itoa(i), Plugin: "bench", Type: plugin.Node, Socket: sockPath(dir, i)})
	}
	for {
		s, err := e.h.Plugin(ctx(b), "bench")
		if err != nil {
			b.Fatal(err)
		}
		if s.NodesHealthy == n {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let the heartbeats settle into their period
	b.Run("registry", measureCPU)
	e.close()

	b.Run("bare-grpc", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		conns := make([]*grpc.ClientConn, n)
		for i := range n {
			cc, err := grpc.NewClient("unix://"+sockPath(dir, i), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			conns[i] = cc
			id, node := csipb.NewIdentityClient(cc), csipb.NewNodeClient(cc)
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTicker(time.Second)
				defer t.Stop()
				for {
					_, _ = id.Probe(ctx, &csipb.ProbeRequest{})
					_, _ = id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
					_, _ = id.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
					_, _ = node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
					_, _ = node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
				}
			}()
		}
		time.Sleep(2 * time.Second)
		measureCPU(b)
		cancel()
		wg.Wait()
		for _, cc := range conns {
			_ = cc.Close()
		}
	})
}

func reportLatencies(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	ms := func(q float64) float64 {
		i := int(q * float64(len(ds)-1))
		return float64(ds[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkDeathDetection measures the time from SIGKILL of an
// exec-managed plugin to the registry's health_changed (unhealthy) event
// reaching a subscriber; the baseline is the time for a bare exec.Cmd.Wait
// to return after SIGKILL of the same plugin program, in the same run.
func BenchmarkDeathDetection(b *testing.B) {
	b.Run("registry", func(b *testing.B) {
		e := newEnv(b, func(c *Config) {
			c.Log.Logger.SetLevel(logrus.WarnLevel)
			c.Plugin.HeartbeatInterval = time.Hour // only the exit and the connection can tell
			c.Plugin.RestartBackoff.Initial = 10 * time.Millisecond
			c.Plugin.RestartBackoff.Max = 20 * time.Millisecond
		})
		defer e.close()
		sub, err := e.h.Subscribe(1024)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Cancel()
		e.register(execSpec(b, "d1", "p", plugin.Node))
		var lat []time.Duration
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			// Consume the stream up to d1's healthy event, so that the next
			// unhealthy event can only come from the kill below.
			for {
				ev := <-sub.C
				if ev.Type == EventLagged {
					b.Fatal("subscriber lagged")
				}
				if ev.Type == EventHealthChanged && ev.Alloc == "d1" && ev.Healthy {
					break
				}
			}
			a, err := e.h.Allocation(ctx(b), "d1")
			if err != nil || !a.Healthy || a.PID == 0 {
				b.Fatalf("allocation = %+v, %v", a, err)
			}
			b.StartTimer()
			t0 := time.Now()
			if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
				b.Fatal(err)
			}
			for {
				ev := <-sub.C
				if ev.Type == EventHealthChanged && ev.Alloc == "d1" {
					if ev.Healthy {
						b.Fatalf("healthy event before the unhealthy one: %+v", ev)
					}
					lat = append(lat, time.Since(t0))
					break
				}
			}
		}
		b.StopTimer()
		reportLatencies(b, lat)
	})

	b.Run("bare-wait", func(b *testing.B) {
		// The same plugin process, started and waited for by a bare
		// exec.Cmd: what the kernel and os/exec alone take.
		dir := shortDir(b)
		spec := execSpec(b, "d1", "p", plugin.Node)
		var lat []time.Duration
		for i := range b.N {
			sock := filepath.Join(dir, strconv.Itoa(i)+".sock")
			cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
			cmd.Env = []string{fakePluginEnv + "=1", "CSI_ENDPOINT=unix://" + sock}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			for {
				if _, err := os.Stat(sock); err == nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			t0 := time.Now()
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
			lat = append(lat, time.Since(t0))
		}
		reportLatencies(b, lat)
	})
}
