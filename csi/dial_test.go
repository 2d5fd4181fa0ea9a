package csi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func TestParseEndpoint(t *testing.T) {
	long107 := "/" + strings.Repeat("a", 106)
	long108 := "/" + strings.Repeat("a", 107)
	tests := []struct {
		in      string
		want    string
		wantErr string // substring of the error; "" for success
	}{
		{"unix:///run/csi/csi.sock", "/run/csi/csi.sock", ""},
		{"/run/csi/csi.sock", "/run/csi/csi.sock", ""},
		{"unix:///run/csi/../x.sock", "/run/x.sock", ""},
		{"unix://" + long107, long107, ""},
		{long107, long107, ""},
		{"unix://" + long108, "", "socket path is 108 bytes, longer than the 107-byte unix socket limit"},
		{long108, "", "108 bytes"},
		{"tcp://127.0.0.1:10000", "", `scheme "tcp" is not supported`},
		{"http:///run/csi.sock", "", `scheme "http" is not supported`},
		{"unix://run/csi.sock", "", `socket path "run/csi.sock" is not absolute`},
		{"csi.sock", "", "is not absolute"},
		{"unix:/run/csi.sock", "", "is not absolute"},
		{"unix://", "", "empty socket path"},
		{"", "", "empty socket path"},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 40 {
			name = name[:40] + "…"
		}
		t.Run(name, func(t *testing.T) {
			got, err := ParseEndpoint(tt.in)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseEndpoint = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrInvalidEndpoint) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseEndpoint error = %v; want ErrInvalidEndpoint containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestDial_InvalidEndpoint_FailsAtOnce(t *testing.T) {
	for _, ep := range []string{"tcp://localhost:1", "relative.sock", "/" + strings.Repeat("x", 200)} {
		// No deadline: Dial must not wait for anything on a bad endpoint.
		c, err := Dial(context.Background(), ep)
		if !errors.Is(err, ErrInvalidEndpoint) || c != nil {
			t.Errorf("Dial(%.30q) = %v, %v; want ErrInvalidEndpoint", ep, c, err)
		}
	}
}

func TestDial_InvalidOption(t *testing.T) {
	tests := []struct {
		opt  Option
		want string
	}{
		{WithRPCTimeout(-time.Second), "rpc timeout -1s is negative"},
		{WithProbeTimeout(-time.Millisecond), "probe timeout -1ms is negative"},
	}
	for _, tt := range tests {
		_, err := Dial(context.Background(), "/nonexistent/csi.sock", tt.opt)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Dial error = %v; want ErrInvalidOption containing %q", err, tt.want)
		}
	}
}

func TestDial_MissingSocket_ContextTimeout(t *testing.T) {
	path := fakeplugin.SocketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c, err := Dial(ctx, "unix://"+path)
	if c != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v, %v; want context.DeadlineExceeded", c, err)
	}
	if !strings.Contains(err.Error(), "socket does not exist") || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q should say the socket at %s does not exist", err, path)
	}
}

func TestDial_NotASocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(testCtx(t), path)
	if !errors.Is(err, ErrInvalidEndpoint) || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("Dial = %v; want ErrInvalidEndpoint: not a socket", err)
	}
}

func TestDial_StaleSocket_ContextTimeout(t *testing.T) {
	p, ep := fakeplugin.Start(t, fakeplugin.Config{})
	p.Kill() // leaves the socket file, nobody listening
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, ep)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection not ready") {
		t.Fatalf("Dial = %v; want a not-ready deadline error", err)
	}
}

func TestDial_WaitsForSocketToAppear(t *testing.T) {
	path := fakeplugin.SocketPath(t)
	type result struct {
		c   Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Dial(testCtx(t), "unix://"+path)
		done <- result{c, err}
	}()
	// Give Dial a head start so that it usually finds no socket; the test
	// passes either way.
	time.Sleep(20 * time.Millisecond)
	p := fakeplugin.New(fakeplugin.Config{})
	if err := p.Serve(path); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	r := <-done
	if r.err != nil {
		t.Fatalf("Dial: %s", r.err)
	}
	defer r.c.Close()
	if s := r.c.State(); s != connectivity.Ready {
		t.Fatalf("State after Dial = %s, want READY", s)
	}
	if ready, err := r.c.Probe(testCtx(t)); err != nil || !ready {
		t.Fatalf("Probe = %v, %v", ready, err)
	}
}

func TestClient_Close_IdempotentThenErrClosed(t *testing.T) {
	_, c := startPlugin(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %s", err)
	}
	if s := c.State(); s != connectivity.Shutdown {
		t.Fatalf("State after Close = %s", s)
	}
	ctx := testCtx(t)
	calls := map[string]func() error{
		"Probe":                     func() error { _, err := c.Probe(ctx); return err },
		"GetPluginInfo":             func() error { _, err := c.PluginInfo(ctx); return err },
		"NodeGetInfo":               func() error { _, err := c.NodeInfo(ctx); return err },
		"NodePublishVolume":         func() error { return c.NodePublishVolume(ctx, nil) },
		"ControllerUnpublishVolume": func() error { return c.ControllerUnpublishVolume(ctx, nil) },
	}
	for method, call := range calls {
		err := call()
		if !errors.Is(err, ErrClosed) || !strings.HasPrefix(err.Error(), method+": ") {
			t.Errorf("%s after Close = %v; want %q-prefixed ErrClosed", method, err, method)
		}
		if got := Classify(PublishKind, err); got != Final {
			t.Errorf("Classify(ErrClosed) = %s, want final", got)
		}
	}
}

func TestClient_WaitForStateChange_PluginKilledAndBack(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{})
	ctx := testCtx(t)
	if s := c.State(); s != connectivity.Ready {
		t.Fatalf("State = %s, want READY", s)
	}
	p.Kill()
	if !c.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatal("WaitForStateChange returned false before the test deadline")
	}
	if s := c.State(); s == connectivity.Ready {
		t.Fatal("still READY after Kill")
	}

	// A short ctx ends WaitForStateChange with false when nothing changes.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	for s := c.State(); s != connectivity.Idle; s = c.State() {
		if !c.WaitForStateChange(ctx, s) {
			t.Fatal("never reached IDLE")
		}
	}
	if c.WaitForStateChange(short, connectivity.Idle) {
		t.Fatalf("WaitForStateChange reported a change from IDLE to %s with nothing happening", c.State())
	}

	// The plugin restarts on the same socket: the next call reconnects.
	if err := p.Serve(p.SocketPath()); err != nil {
		t.Fatal(err)
	}
	if ready, err := c.Probe(ctx); err != nil || !ready {
		t.Fatalf("Probe after restart = %v, %v", ready, err)
	}
	// gRPC publishes connectivity changes asynchronously, so the state can
	// trail the successful call by a moment: it must still reach READY.
	for s := c.State(); s != connectivity.Ready; s = c.State() {
		if !c.WaitForStateChange(ctx, s) {
			t.Fatalf("State after restart stayed %s, never READY", s)
		}
	}
}
