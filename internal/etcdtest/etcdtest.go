// Package etcdtest runs a single-member etcd server in the test process, on
// 127.0.0.1, for the tests of cluster mode. It links the etcd server; only
// tests and the cluster example import it, never the agent.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
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
	name       string
	dir        string
	clientURL  url.URL
	peerURL    url.URL
	cluster    string // the initial cluster, name=peer URL,...
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
	s := &Server{t: t, name: "etcdtest", dir: dir, clientURL: freeURL(t), peerURL: freeURL(t)}
	s.cluster = s.name + "=" + s.peerURL.String()
	t.Cleanup(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	s.start()
	return s
}

// StartCluster starts an n-member cluster, each member in its own data dir
// on its own loopback ports; they are stopped when t ends.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	ss := make([]*Server, n)
	var peers []string
	for i := range ss {
		dir, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{t: t, name: fmt.Sprintf("m%d", i+1), dir: dir, clientURL: freeURL(t), peerURL: freeURL(t)}
		ss[i] = s
		peers = append(peers, s.name+"="+s.peerURL.String())
		t.Cleanup(func() {
			s.Stop()
			_ = os.RemoveAll(dir)
		})
	}
	// The members wait for each other to be ready: start them together.
	errs := make(chan error, n)
	for _, s := range ss {
		s.cluster = strings.Join(peers, ",")
		go func() { errs <- s.startErr() }()
	}
	for range ss {
		if err := <-errs; err != nil {
			t.Fatalf("etcdtest: %s", err)
		}
	}
	return ss
}

// Endpoints returns the client URLs of ss.
func Endpoints(ss []*Server) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Endpoint()
	}
	return out
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
	if err := s.startErr(); err != nil {
		s.t.Fatalf("etcdtest: %s", err)
	}
}

func (s *Server) startErr() error {
	cfg := embed.NewConfig()
	cfg.Name = s.name
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = s.cluster
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 50, 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("%s not ready after %s", s.name, StartTimeout)
	}
	s.etcd, s.stoppedYet = e, false
	return nil
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

// Restart starts a stopped server again on the same data and ports. A
// member of a cluster waits for a quorum: restart members with
// RestartAll.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// RestartAll restarts the stopped members of a cluster together.
func RestartAll(t testing.TB, ss []*Server) {
	t.Helper()
	errs := make(chan error, len(ss))
	for _, s := range ss {
		s.Stop()
		go func() { errs <- s.startErr() }()
	}
	for range ss {
		if err := <-errs; err != nil {
			t.Fatalf("etcdtest: %s", err)
		}
	}
}

// DBSize returns the size of the member's database file and the part of it
// logically in use (etcd_mvcc_db_total_size_in_bytes and
// etcd_mvcc_db_total_size_in_use_in_bytes of a real member).
func (s *Server) DBSize() (size, inUse int64) {
	b := s.etcd.Server.Backend()
	return b.Size(), b.SizeInUse()
}
