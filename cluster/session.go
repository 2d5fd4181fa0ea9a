package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// Session is this host's membership of the cluster: an etcd client, a
// lease with this host's liveness key on it, and the goroutines that renew
// the lease and free released claims. All methods are safe for concurrent
// use. Close it once at the end.
type Session struct {
	cfg     Config
	log     *logrus.Entry
	cli     *clientv3.Client
	metrics *metrics
	reg     prometheus.Registerer

	mu        sync.Mutex
	lease     clientv3.LeaseID    // guarded by mu
	ttl       time.Duration       // guarded by mu; as granted
	renewSent time.Time           // guarded by mu; send time of the last acknowledged keepalive (or grant)
	renewErr  bool                // guarded by mu; the last renewal failed
	frees     map[claimRef]string // guarded by mu; claims to remove from etcd, with their nonce
	nonces    map[claimRef]string // guarded by mu; the nonce of every claim this session admitted
	requested map[string]bool     // guarded by mu; keys of this host's controller requests (see ControllerRequested)
	applied   map[string]int64    // guarded by mu; see Applied
	appliedCh chan struct{}       // guarded by mu; closed and replaced at every Applied
	closed    bool                // guarded by mu

	kick      chan struct{}   // wakes the free loop
	rejoined  chan struct{}   // see Rejoined
	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type claimRef struct{ volume, alloc string }

// hostRecord is the value of <prefix>/hosts/<node>.
type hostRecord struct {
	ID        string    `json:"id"`
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
}

// Open dials etcd, grants this host's lease, writes its liveness key and
// starts renewing it. etcd that does not answer within cfg.DialTimeout is
// an error wrapping ErrUnavailable that names the endpoints.
func Open(ctx context.Context, cfg Config) (*Session, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.DialTimeout,
		DialKeepAliveTimeout: cfg.DialTimeout,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
		// gRPC's default reconnect backoff grows to 2 minutes: an agent
		// would go on refusing claims long after etcd is back.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: cfg.DialTimeout,
		}), grpc.WithChainUnaryInterceptor(requireLeader)},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd %v: %w", ErrUnavailable, cfg.Endpoints, err)
	}
	s := &Session{
		cfg:       cfg,
		log:       log,
		cli:       cli,
		metrics:   newMetrics(),
		reg:       cfg.Registerer,
		frees:     map[claimRef]string{},
		nonces:    map[claimRef]string{},
		requested: map[string]bool{},
		applied:   map[string]int64{},
		appliedCh: make(chan struct{}),
		kick:      make(chan struct{}, 1),
		rejoined:  make(chan struct{}, 1),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.grant(ctx); err != nil {
		s.cancel()
		_ = cli.Close()
		return nil, fmt.Errorf("%w: etcd %v does not answer: %w", ErrUnavailable, cfg.Endpoints, err)
	}
	if err := s.loadRequested(ctx); err != nil {
		s.cancel()
		_ = cli.Close()
		return nil, err
	}
	if s.reg != nil {
		for i, c := range s.metrics.collectors() {
			if err := s.reg.Register(c); err != nil {
				for _, d := range s.metrics.collectors()[:i] {
					s.reg.Unregister(d)
				}
				s.cancel()
				_ = cli.Close()
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	s.wg.Add(3)
	go s.renewLoop()
	go s.hostsLoop()
	go s.freeLoop()
	s.log.WithFields(logrus.Fields{"node": cfg.NodeID, "endpoints": cfg.Endpoints, "lease_ttl": s.TTL()}).Info("joined the cluster")
	return s, nil
}

// requireLeader makes every request ask for a member that has a leader,
// and sends it again while the member answers that it has none: a member
// cut from the majority then refuses at once instead of holding the
// request until it times out, and the next attempt goes to another member
// (the client sends round robin). The member refuses before it runs the
// request, so sending a write again is as safe as a read. While the
// cluster elects a leader, requests wait for it as they did without this,
// up to their deadline.
func requireLeader(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx = clientv3.WithRequireLeader(ctx)
	wait := noLeaderRetry
	for {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*noLeaderRetry)
	}
}

// noLeaderRetry is the first pause before a request refused for want of a
// leader is sent again; it doubles up to 20 times as long.
const noLeaderRetry = 25 * time.Millisecond

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// NodeID returns this host's node ID.
func (s *Session) NodeID() string { return s.cfg.NodeID }

// TTL returns the TTL etcd granted this host's lease.
func (s *Session) TTL() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ttl
}

func (s *Session) key(parts ...string) string {
	k := s.cfg.Prefix
	for _, p := range parts {
		k += "/" + p
	}
	return k
}

func (s *Session) aliveKey(node string) string { return s.key("alive", node) }

// reqCtx bounds one etcd request.
func (s *Session) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.DialTimeout)
}

// grant grants a new lease and writes the liveness and host keys.
func (s *Session) grant(ctx context.Context) error {
	sent := time.Now()
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	secs := int64((s.cfg.LeaseTTL + time.Second - 1) / time.Second)
	resp, err := s.cli.Grant(rctx, secs)
	s.metrics.observe("grant", sent)
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	now := time.Now()
	rec, _ := json.Marshal(hostRecord{ID: s.cfg.NodeID, StartedAt: now, LastSeen: now})
	start := time.Now()
	_, err = s.cli.Txn(rctx).Then(
		clientv3.OpPut(s.aliveKey(s.cfg.NodeID), string(rec), clientv3.WithLease(resp.ID)),
		clientv3.OpPut(s.key("hosts", s.cfg.NodeID), string(rec)),
	).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return fmt.Errorf("write liveness key: %w", err)
	}
	s.mu.Lock()
	s.lease, s.ttl, s.renewSent = resp.ID, time.Duration(resp.TTL)*time.Second, sent
	s.mu.Unlock()
	return nil
}

// renewInterval is how often the lease is renewed: four times per TTL.
func (s *Session) renewInterval() time.Duration { return s.TTL() / 4 }

// AdmitDeadline returns the time after which this host admits no new
// claim unless its lease is renewed first: the send time of the last
// keepalive etcd acknowledged plus three quarters of the TTL. etcd
// received that keepalive after it was sent, so the lease cannot expire on
// the server before a quarter of the TTL after this deadline.
func (s *Session) AdmitDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewSent.Add(s.ttl - s.ttl/4)
}

// admitting returns the lease to admit a claim under, or ErrUnavailable
// once AdmitDeadline has passed.
func (s *Session) admitting() (clientv3.LeaseID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if d := s.renewSent.Add(s.ttl - s.ttl/4); time.Now().After(d) {
		return 0, fmt.Errorf("%w: this host's etcd lease was last renewed %s ago (ttl %s); new claims are refused until etcd answers",
			ErrUnavailable, time.Since(s.renewSent).Round(time.Millisecond), s.ttl)
	}
	return s.lease, nil
}

// renewLoop renews the lease every renewInterval until Close, granting a
// new one when etcd says it expired. It does nothing else: a request that
// hangs on a member cut from the majority holds its loop until the request
// times out (dial_timeout), and the renewals must go on meanwhile.
func (s *Session) renewLoop() {
	defer s.wg.Done()
	s.every(s.renewInterval(), s.renew)
}

// hostsLoop records this host as seen and refreshes the host gauge every
// renewInterval until Close.
func (s *Session) hostsLoop() {
	defer s.wg.Done()
	s.every(s.renewInterval(), func() {
		s.touch(s.ctx)
		s.refreshHosts()
	})
}

// every calls fn every d until Close.
func (s *Session) every(d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

func (s *Session) renew() {
	ctx := s.ctx
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	sent, err := s.keepAlive(ctx, lease)
	s.mu.Lock()
	s.renewErr = err != nil
	s.mu.Unlock()
	switch {
	case err == nil:
		s.mu.Lock()
		if s.lease == lease && sent.After(s.renewSent) {
			s.renewSent = sent
		}
		s.mu.Unlock()
		s.metrics.renewals.WithLabelValues(renewOK).Inc()
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		s.metrics.renewals.WithLabelValues(renewExpired).Inc()
		s.log.Warn("this host's etcd lease expired; granting a new one")
		if err := s.grant(ctx); err != nil {
			s.log.WithError(err).Warn("cannot renew this host's etcd lease")
			break
		}
		select {
		case s.rejoined <- struct{}{}:
		default:
		}
	default:
		s.metrics.renewals.WithLabelValues(renewError).Inc()
		if ctx.Err() == nil {
			s.log.WithError(err).Warn("cannot renew this host's etcd lease")
		}
	}
}

// keepAlive renews lease once and returns the send time of the attempt
// that etcd answered. It tries again until the renewal interval is over:
// each attempt asks for a member that has a leader and gets half the
// interval, so an attempt sent to a member cut from the majority fails at
// once (ErrNoLeader) or times out, and the next one goes to another member
// (the client sends round robin). One attempt each interval could keep
// landing on the same cut member, and let a healthy host's lease expire.
func (s *Session) keepAlive(ctx context.Context, lease clientv3.LeaseID) (time.Time, error) {
	interval := s.renewInterval()
	end := time.Now().Add(interval)
	for {
		sent := time.Now()
		actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), interval/2)
		_, err := s.cli.KeepAliveOnce(actx, lease)
		cancel()
		s.metrics.observe("keepalive", sent)
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || !time.Now().Before(end) {
			return sent, err
		}
		select {
		case <-ctx.Done():
			return sent, err
		case <-time.After(interval / 10):
		}
	}
}

// touch records when this host was last seen.
func (s *Session) touch(ctx context.Context) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	key := s.key("hosts", s.cfg.NodeID)
	start := time.Now()
	resp, err := s.cli.Get(rctx, key)
	s.metrics.observe("get", start)
	if err != nil {
		return
	}
	var rec hostRecord
	if len(resp.Kvs) > 0 {
		_ = json.Unmarshal(resp.Kvs[0].Value, &rec)
	}
	rec.ID, rec.LastSeen = s.cfg.NodeID, time.Now()
	data, _ := json.Marshal(rec)
	start = time.Now()
	_, _ = s.cli.Put(rctx, key, string(data))
	s.metrics.observe("put", start)
}

// LeaveTimeout bounds each etcd request made on the way out (Close's
// revocation of the host's lease, the controller elections'
// revocations): an agent stopping while etcd is slow, or cut off so
// recently that its connection still looks up, does not wait on it for
// long. While etcd is known to be unreachable (see revoke), none is made.
const LeaveTimeout = 500 * time.Millisecond

// revoke revokes lease on the way out, within LeaveTimeout, and reports
// whether etcd confirmed it. While etcd is known to be unreachable (no
// connection to a member, or the last renewal of this host's lease
// failed) it sends nothing: the lease expires on the server at its TTL,
// and a stop must not wait on etcd.
func (s *Session) revoke(ctx context.Context, lease clientv3.LeaseID) error {
	s.mu.Lock()
	failing := s.renewErr
	s.mu.Unlock()
	if st := s.cli.ActiveConnection().GetState(); failing || st != connectivity.Ready {
		return fmt.Errorf("%w: etcd is unreachable (connection %s, last renewal failed: %t)", ErrUnavailable, st, failing)
	}
	rctx, cancel := context.WithTimeout(ctx, LeaveTimeout)
	defer cancel()
	_, err := s.cli.Revoke(rctx, lease)
	return err
}

// Close stops renewing the lease and revokes it (this host is down at
// once; its claims stay), stops the background goroutines and closes the
// etcd client. With etcd unreachable it does not revoke the lease, which
// expires on the server at its TTL; the revocation waits LeaveTimeout at
// most. Claims still to be freed are freed by the next Prune. It is
// idempotent.
func (s *Session) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		lease := s.lease
		s.mu.Unlock()
		s.cancel()
		s.wg.Wait()
		if rerr := s.revoke(ctx, lease); rerr != nil {
			s.log.WithError(rerr).Info("did not revoke this host's etcd lease; it expires on its own")
		}
		err = s.cli.Close()
		if s.reg != nil {
			for _, c := range s.metrics.collectors() {
				s.reg.Unregister(c)
			}
		}
		s.log.Info("left the cluster")
	})
	return err
}
