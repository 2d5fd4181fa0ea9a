package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// childEnv makes the test binary act as the plugin binary, so that tests
// can run it as a real process.
const childEnv = "CSIACTOR_EXAMPLE_PLUGIN_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
	}
	leakcheck.VerifyTestMain(m)
}

func TestRun_BadUsage(t *testing.T) {
	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantMsg  string
	}{
		{"unknown flag", []string{"-bogus"}, nil, 2, "bogus"},
		{"positional argument", []string{"-endpoint", sock, "-state-dir", dir, "extra"}, nil, 2, `"extra"`},
		{"no endpoint", []string{"-state-dir", dir}, nil, 2, "-endpoint (or CSI_ENDPOINT) is required"},
		{"no state dir", []string{"-endpoint", sock}, nil, 2, "-state-dir is required"},
		{"no state dir, endpoint from env", nil, map[string]string{"CSI_ENDPOINT": sock}, 2, "-state-dir is required"},
		{"bad log level", []string{"-endpoint", sock, "-state-dir", dir, "-log-level", "loud"}, nil, 2, "-log-level"},
		{"bad log format", []string{"-endpoint", sock, "-state-dir", dir, "-log-format", "xml"}, nil, 2, "-log-format"},
		{"bad mount mode", []string{"-endpoint", sock, "-state-dir", dir, "-mount-mode", "overlay"}, nil, 2, "-mount-mode"},
		{"tcp endpoint", []string{"-endpoint", "tcp://127.0.0.1:9", "-state-dir", dir}, nil, 2, "endpoint"},
		{"help", []string{"-h"}, nil, 0, "-state-dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			getenv := func(k string) string { return tt.env[k] }
			if code := run(tt.args, getenv, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantMsg) {
				t.Errorf("stderr does not mention %q:\n%s", tt.wantMsg, stderr.String())
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "csi.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bad usage created the socket: %v", err)
	}
}

// TestRun_Process_Signals runs the binary as a real process, with the
// endpoint from CSI_ENDPOINT, and stops it with each signal it handles.
func TestRun_Process_Signals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "csi.sock")
			cmd := exec.Command(os.Args[0], "-state-dir", filepath.Join(dir, "state"), "-node-id", "n1", "-log-format", "json")
			// GORACE: a race-enabled child otherwise sleeps 1 s at exit.
			cmd.Env = append(os.Environ(), childEnv+"=1", "CSI_ENDPOINT=unix://"+sock, "GORACE=atexit_sleep_ms=0")
			// The process writes stderr while a failure message may read it.
			var stderr lockedBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waited := false
			t.Cleanup(func() {
				if !waited {
					cmd.Process.Kill()
					cmd.Wait()
				}
			})

			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
				// The socket appears after the dial starts: retry quickly.
				grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}}))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			info, err := csipb.NewNodeClient(conn).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{}, grpc.WaitForReady(true))
			conn.Close()
			if err != nil {
				t.Fatalf("NodeGetInfo: %v\nstderr:\n%s", err, stderr.String())
			}
			if info.GetNodeId() != "n1" {
				t.Errorf("node id %q, want n1 from -node-id", info.GetNodeId())
			}

			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			waited = true
			if err != nil {
				t.Fatalf("exit after %s: %v\nstderr:\n%s", sig, err, stderr.String())
			}
			if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket left after exit: %v", err)
			}
			if !strings.Contains(stderr.String(), `"msg":"stopped"`) {
				t.Errorf("no JSON 'stopped' log line:\n%s", stderr.String())
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer (a process's output
// copied by exec) and readers at the same time.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
