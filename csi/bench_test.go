package csi

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// benchClients returns, for one fake plugin, a Client as production builds
// it (metrics on, logger at info) and a bare gRPC connection to the same
// socket: the baseline of the same run.
func benchClients(b *testing.B, debug bool) (Client, *grpc.ClientConn) {
	b.Helper()
	_, ep := fakeplugin.Start(b, fakeplugin.Config{})
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	if debug {
		l.SetLevel(logrus.DebugLevel)
	}
	c, err := Dial(context.Background(), ep, WithMetrics(m), WithLogger(logrus.NewEntry(l)), WithPluginName("fake"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	cc, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	return c, cc
}

// BenchmarkNodePublish publishes the same volume to the same target over
// and over (the plugin's idempotent path), through our Client and through a
// bare generated client.
func BenchmarkNodePublish(b *testing.B) {
	c, cc := benchClients(b, false)
	cd, _ := benchClients(b, true)
	ctx := context.Background()
	req := &csipb.NodePublishVolumeRequest{
		VolumeId: "vol", TargetPath: filepath.Join(b.TempDir(), "target"),
		VolumeCapability: mountCap("noatime"), Secrets: map[string]string{"k": "v"},
	}
	b.Run("ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.NodePublishVolume(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ours-debug-log", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := cd.NodePublishVolume(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-grpc", func(b *testing.B) {
		nc := csipb.NewNodeClient(cc)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := nc.NodePublishVolume(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkProbe is the heartbeat's call, through our Client and bare.
func BenchmarkProbe(b *testing.B) {
	c, cc := benchClients(b, false)
	ctx := context.Background()
	b.Run("ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Probe(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-grpc", func(b *testing.B) {
		ic := csipb.NewIdentityClient(cc)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ic.Probe(ctx, &csipb.ProbeRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSanitize is the cost of rendering a request for a debug log.
func BenchmarkSanitize(b *testing.B) {
	req := secretRequests()["NodeStageVolume"]
	b.ReportAllocs()
	for b.Loop() {
		_ = Sanitize(req)
	}
}

// BenchmarkRPCTimeout compares two ways of giving an RPC its timeout, on
// the same Client (same connection, same interceptors), interleaved in
// chunks so that both see the same machine load: "timer" is a
// context.WithTimeout per call (a runtime timer armed and stopped per call,
// what invoke did before), "watchdog" is the Client's own timeout (the
// deadlines watchdog). "bare" is a plain gRPC client without any timeout on
// its own connection: the floor. Each reports µs per call.
func BenchmarkRPCTimeout(b *testing.B) {
	c, cc := benchClients(b, false)
	nc := csipb.NewNodeClient(cc)
	ctx := context.Background()
	req := &csipb.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: filepath.Join(b.TempDir(), "target")}
	variants := []struct {
		name string
		call func() error
	}{
		{"bare", func() error { _, err := nc.NodeUnpublishVolume(ctx, req); return err }},
		{"timer", func() error {
			// Earlier than the Client's RPC timeout: the call runs on this
			// context's timer and the watchdog stays out of it.
			tctx, cancel := context.WithTimeout(ctx, DefaultRPCTimeout/2)
			defer cancel()
			return c.NodeUnpublishVolume(tctx, req)
		}},
		{"watchdog", func() error { return c.NodeUnpublishVolume(ctx, req) }},
	}
	spent := make([]time.Duration, len(variants))
	const chunk = 20
	for done := 0; done < b.N; done += chunk {
		for i, v := range variants {
			t0 := time.Now()
			for range chunk {
				if err := v.call(); err != nil {
					b.Fatal(err)
				}
			}
			spent[i] += time.Since(t0)
		}
	}
	calls := float64((b.N + chunk - 1) / chunk * chunk)
	for i, v := range variants {
		b.ReportMetric(float64(spent[i].Microseconds())/calls, v.name+"-us/call")
	}
}
