// Package etcdtest runs a single-member etcd server in the test process, on
// 127.0.0.1, for the tests of cluster mode. It links the etcd server; only
// tests and the cluster example import it, never the agent.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTimeout bounds how long Start waits for the server to be ready.
const StartTimeout = 60 * time.Second

// Server is an embedded etcd member. Stop and Restart keep its data and
// ports, so clients reconnect to the same endpoint.
type Server struct {
	t          testing.TB
	dir        string
	clientURL  url.URL
	peerURL    url.URL
	etcd       *embed.Etcd
	stoppedYet bool
}

// Start starts a server in a fresh data dir on two free loopback ports; it
// is stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, dir: dir, clientURL: freeURL(t), peerURL: freeURL(t)}
	t.Cleanup(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	s.start()
	return s
}

func freeURL(t testing.TB) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return url.URL{Scheme: "http", Host: addr}
}

func (s *Server) start() {
	s.t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, s.peerURL.String())
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 50, 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		s.t.Fatalf("etcdtest: start: %s", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(StartTimeout):
		e.Close()
		s.t.Fatalf("etcdtest: not ready after %s", StartTimeout)
	}
	s.etcd, s.stoppedYet = e, false
}

// Endpoint returns the client URL, like "http://127.0.0.1:40123".
func (s *Server) Endpoint() string { return s.clientURL.String() }

// Stop stops the server; clients see it unreachable. It is idempotent.
func (s *Server) Stop() {
	if s.stoppedYet || s.etcd == nil {
		return
	}
	s.stoppedYet = true
	s.etcd.Close()
}

// Restart starts a stopped server again on the same data and ports.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}
