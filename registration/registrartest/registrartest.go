// Package registrartest is a registrar for tests: what node-driver-registrar
// is beside a CSI driver, a gRPC server of the kubelet's plugin
// registration API v1 on a unix socket, which records the registration
// statuses it is told.
package registrartest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/csiactor/csiactor/registration"
)

// Registrar serves one registration socket.
type Registrar struct {
	// Path is the registration socket.
	Path string

	info     registration.PluginInfo
	srv      *grpc.Server
	done     chan struct{}
	statuses chan registration.RegistrationStatus

	mu       sync.Mutex
	getInfos int // guarded by mu
	stopOnce sync.Once
}

// Serve serves a registrar that announces info on the unix socket path
// (created now) until Stop or the end of the test.
func Serve(t testing.TB, path string, info registration.PluginInfo) *Registrar {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("registrartest: %s", err)
	}
	r := &Registrar{Path: path, info: info, srv: grpc.NewServer(), done: make(chan struct{}),
		statuses: make(chan registration.RegistrationStatus, 16)}
	registration.RegisterServer(r.srv, (*server)(r))
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(l)
	}()
	t.Cleanup(r.Stop)
	return r
}

// Stop stops serving and removes the socket, as a registrar that exits
// does; it returns when the server is gone. It is idempotent.
func (r *Registrar) Stop() {
	r.stopOnce.Do(func() {
		r.srv.Stop() // closes the listener, which unlinks the socket
		<-r.done
	})
}

// Status waits up to timeout for the next NotifyRegistrationStatus and
// returns it; the test fails when none comes.
func (r *Registrar) Status(t testing.TB, timeout time.Duration) registration.RegistrationStatus {
	t.Helper()
	select {
	case s := <-r.statuses:
		return s
	case <-time.After(timeout):
		t.Fatalf("registrartest: no NotifyRegistrationStatus on %s within %s", r.Path, timeout)
		return registration.RegistrationStatus{}
	}
}

// NoStatus fails the test if a NotifyRegistrationStatus comes within wait.
func (r *Registrar) NoStatus(t testing.TB, wait time.Duration) {
	t.Helper()
	select {
	case s := <-r.statuses:
		t.Fatalf("registrartest: unexpected NotifyRegistrationStatus %+v on %s", s, r.Path)
	case <-time.After(wait):
	}
}

// GetInfos returns how many times GetInfo was called.
func (r *Registrar) GetInfos() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.getInfos
}

type server Registrar

func (s *server) GetInfo(context.Context) (registration.PluginInfo, error) {
	s.mu.Lock()
	s.getInfos++
	s.mu.Unlock()
	return s.info, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st registration.RegistrationStatus) error {
	select {
	case s.statuses <- st:
	default: // a test that does not read them does not block the agent
	}
	return nil
}
