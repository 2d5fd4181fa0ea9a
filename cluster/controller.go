package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Controller request operations.
const (
	// OpPublish asks for ControllerPublishVolume.
	OpPublish = "publish"
	// OpUnpublish asks for ControllerUnpublishVolume.
	OpUnpublish = "unpublish"
	// OpCreateVolume asks for CreateVolume (also a restore from a
	// snapshot, or a clone); its Volume is the CSI name.
	OpCreateVolume = "create-volume"
	// OpDeleteVolume asks for DeleteVolume; its Volume is the CSI volume
	// ID.
	OpDeleteVolume = "delete-volume"
	// OpExpandVolume asks for ControllerExpandVolume; its Volume is the
	// CSI volume ID.
	OpExpandVolume = "expand-volume"
	// OpValidateVolume asks for ValidateVolumeCapabilities; its Volume
	// is the CSI volume ID.
	OpValidateVolume = "validate-volume"
	// OpCreateSnapshot asks for CreateSnapshot; its Volume is the CSI
	// name of the snapshot.
	OpCreateSnapshot = "create-snapshot"
	// OpDeleteSnapshot asks for DeleteSnapshot; its Volume is the CSI
	// snapshot ID.
	OpDeleteSnapshot = "delete-snapshot"
	// OpModifyVolume asks for ControllerModifyVolume; its Volume is the
	// CSI volume ID.
	OpModifyVolume = "modify-volume"
)

// isClaimOp says whether op is a claim step's (ControllerPublishVolume or
// ControllerUnpublishVolume), keyed by volume and node; the others are
// one-shot operations, keyed by operation, subject and host, and removed
// once their requester has read the answer.
func isClaimOp(op string) bool { return op == OpPublish || op == OpUnpublish }

// ErrNoController is returned by ControllerLeader, and wrapped by
// RequestController, when no host of the cluster leads the controller of
// the plugin: none has a healthy controller allocation of it.
var ErrNoController = errors.New("no controller of the plugin in the cluster")

// ControllerRequest is a controller call that a host without a healthy
// controller of the plugin asks the plugin's controller leader to run for
// it.
//
// A claim step (OpPublish, OpUnpublish) has the key
// <prefix>/controller/<plugin>/<volume>/<CSI node ID>: one per volume and
// node, like a Kubernetes VolumeAttachment, rewritten by every new request
// for them and removed once an unpublish of them succeeded.
//
// Any other operation has the key
// <prefix>/controller/<plugin>/~<op>/<subject>/<host> (no volume ID has a
// '~'): one per operation, CSI name or ID and requesting host, removed by
// the requester once it has read the answer. A requester that restarts
// and asks for the same call again finds the answer (or the pending
// request) there; see RequestController.
type ControllerRequest struct {
	// Volume is, for a claim step, the volume's ID in the cluster, and
	// Node the CSI node ID the step is for (the claiming host's node
	// plugin's). For another operation Volume is the CSI name or ID the
	// call is about (see the Op constants) and Node is empty.
	Volume string `json:"volume"`
	Node   string `json:"node,omitempty"`
	// Op is one of the Op constants.
	Op string `json:"op"`
	// Host is the cluster node that asked.
	Host string `json:"host"`
	// Body is the CSI request without its secrets, encoded by the caller
	// and opaque to the cluster.
	Body []byte `json:"body"`
	// Secrets are the CSI request's secrets (the volume's or the
	// snapshot's, as the caller has them), kept apart from Body so that
	// they can be sealed on their own. Nil when the call has none. The
	// cluster never reads them: the caller seals them (each value then
	// differs at every write) and sets SecretsDigest, by which two
	// requests compare their secrets instead.
	Secrets       map[string]string `json:"secrets,omitempty"`
	SecretsDigest string            `json:"secrets_digest,omitempty"`
	// SecretsFrom, instead of Secrets, is the reference the caller read
	// the secrets from (a volume's secrets_from): the leader reads it on
	// its own host, so the values never go through etcd.
	SecretsFrom string `json:"secrets_from,omitempty"`
	// Attempt is new at every write of the request; the answer names it.
	Attempt string    `json:"attempt"`
	At      time.Time `json:"at"`
	// Answer is the leader's, once it ran the step.
	Answer *ControllerAnswer `json:"answer,omitempty"`
}

// sameSecrets reports whether requests a and b carry the same secrets:
// by digest where they have one, else by value.
func sameSecrets(a, b *ControllerRequest) bool {
	if a.SecretsFrom != b.SecretsFrom {
		return false
	}
	if a.SecretsDigest != "" || b.SecretsDigest != "" {
		return a.SecretsDigest == b.SecretsDigest
	}
	return maps.Equal(a.Secrets, b.Secrets)
}

// ControllerAnswer is what the controller leader's plugin answered.
type ControllerAnswer struct {
	// Code is the gRPC status code (0 is OK) and Message its message:
	// the requesting host classifies them as it would a local answer.
	Code    uint32 `json:"code"`
	Message string `json:"message,omitempty"`
	// PublishContext is ControllerPublishVolume's answer.
	PublishContext map[string]string `json:"publish_context,omitempty"`
	// Body is the CSI response of another operation, encoded by the
	// leader and opaque to the cluster.
	Body []byte `json:"body,omitempty"`
	// By is the host that ran the step, for the request's Attempt.
	By      string `json:"by"`
	Attempt string `json:"attempt"`
}

func (s *Session) controllerPrefix(plugin string) string {
	return s.key("controller", url.PathEscape(plugin)) + "/"
}

func (s *Session) controllerKey(plugin, volume, node string) string {
	return s.controllerPrefix(plugin) + url.PathEscape(volume) + "/" + url.PathEscape(node)
}

// requestKey is the key of req, a request of this host.
func (s *Session) requestKey(plugin string, req ControllerRequest) string {
	if isClaimOp(req.Op) {
		return s.controllerKey(plugin, req.Volume, req.Node)
	}
	return s.controllerPrefix(plugin) + "~" + url.PathEscape(req.Op) + "/" + url.PathEscape(req.Volume) + "/" + url.PathEscape(s.cfg.NodeID)
}

// loadRequested finds the controller requests an earlier run of this
// host left in etcd (see ControllerRequested).
func (s *Session) loadRequested(ctx context.Context) error {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.key("controller")+"/", clientv3.WithPrefix())
	s.metrics.observe("get", start)
	if err != nil {
		return fmt.Errorf("%w: list controller requests: %w", ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kv := range resp.Kvs {
		var r ControllerRequest
		if json.Unmarshal(kv.Value, &r) == nil && r.Host == s.cfg.NodeID && r.binds() {
			s.requested[string(kv.Key)] = true
		}
	}
	return nil
}

// binds says whether r keeps its host's later controller steps of the
// volume with the leader (see ControllerRequested): it is pending, or
// the leader published the volume (a publish that succeeded, or an
// unpublish that failed).
func (r *ControllerRequest) binds() bool {
	return isClaimOp(r.Op) && (r.Answer == nil || (r.Op == OpPublish) == (r.Answer.Code == 0))
}

// ControllerRequested reports whether this host has a controller request
// for volume of plugin with the leader that is still pending, or whose
// publish the leader ran and no unpublish there undid since (as this
// host wrote and saw them in this run, or found them at Open). While it
// has, the host's controller steps of the volume must go through the
// leader too (RequestController), even with a controller of its own: the
// leader runs the requests of a volume and node one at a time, in order,
// so an unpublish sent there cannot be overtaken by a publish still
// pending there, and it undoes the publish where it ran. Run on the
// host's own controller, the unpublish would leave the publication
// standing, held by no claim, and other hosts' ControllerPublishVolume of
// the volume would fail.
func (s *Session) ControllerRequested(plugin, volume string) bool {
	prefix := s.controllerPrefix(plugin) + url.PathEscape(volume) + "/"
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.requested {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// HasControllerRequest reports whether etcd holds a controller request of
// plugin for volume and the CSI node ID node that is pending, or whose
// publish the leader ran and no unpublish there undid since: a
// ControllerUnpublishVolume for them (a fence's) must then go through
// the leader too (see ControllerRequested). It fails with ErrUnavailable
// when etcd does not answer.
func (s *Session) HasControllerRequest(ctx context.Context, plugin, volume, node string) (bool, error) {
	r, _, err := s.readRequest(ctx, s.controllerKey(plugin, volume, node))
	if err != nil {
		return false, err
	}
	return r != nil && r.binds(), nil
}

func (s *Session) noteRequested(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.requested[key] = true
	} else {
		delete(s.requested, key)
	}
}

func (s *Session) leaderPrefix(plugin string) string {
	return s.key("leaders", url.PathEscape(plugin))
}

// ControllerLeader returns the host that leads the controller of plugin,
// or an error wrapping ErrNoController when none does.
func (s *Session) ControllerLeader(ctx context.Context, plugin string) (string, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.leaderPrefix(plugin)+"/", clientv3.WithFirstCreate()...)
	s.metrics.observe("get", start)
	if err != nil {
		return "", fmt.Errorf("%w: look up the controller leader of plugin %q: %w", ErrUnavailable, plugin, err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("%w: no host of the cluster has a healthy controller of plugin %q", ErrNoController, plugin)
	}
	return string(resp.Kvs[0].Value), nil
}

// WaitControllerLeader blocks until some host leads the controller of
// plugin, or ctx ends (it then returns ctx's error).
func (s *Session) WaitControllerLeader(ctx context.Context, plugin string) error {
	for {
		if _, err := s.ControllerLeader(ctx, plugin); err == nil {
			return nil
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (s *Session) readRequest(ctx context.Context, key string) (*ControllerRequest, int64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, key)
	s.metrics.observe("get", start)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: read controller request: %w", ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	var r ControllerRequest
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return nil, resp.Kvs[0].ModRevision, nil // unreadable: overwritten by the next request
	}
	return &r, resp.Kvs[0].ModRevision, nil
}

// RequestController asks the controller leader of plugin to run req (its
// Volume, Node, Op, Body and Secrets) and waits for the answer until ctx
// ends. A request for the same call that is still pending (written by
// this host before it crashed, or by an earlier try) is waited for rather
// than written again; any other is replaced by a new attempt, which the
// leader runs again (CSI controller calls are idempotent). When the
// leader changes before it answers, the next leader runs it. A successful
// unpublish removes the request.
//
// A request other than a claim step's that was answered already (this
// host asked, then crashed or gave up before it read the answer) is
// answered from etcd without running it again; the answer read, the
// request is removed, whatever the answer.
//
// It fails with ErrUnavailable when etcd does not answer, with an error
// wrapping ErrNoController when no host leads the plugin's controller,
// and with ctx's error when ctx ends first.
func (s *Session) RequestController(ctx context.Context, plugin string, req ControllerRequest) (ControllerAnswer, error) {
	if _, err := s.ControllerLeader(ctx, plugin); err != nil {
		return ControllerAnswer{}, err
	}
	key := s.requestKey(plugin, req)
	claimOp := isClaimOp(req.Op)
	for range maxCAS {
		cur, rev, err := s.readRequest(ctx, key)
		if err != nil {
			return ControllerAnswer{}, err
		}
		same := cur != nil && cur.Op == req.Op && bytes.Equal(cur.Body, req.Body) && sameSecrets(cur, &req)
		if same && cur.Answer != nil && !claimOp && cur.Answer.Attempt == cur.Attempt {
			s.consumed(ctx, key, rev)
			return *cur.Answer, nil
		}
		mine := cur
		if !same || cur.Answer != nil {
			n := req
			n.Host, n.At, n.Answer = s.cfg.NodeID, time.Now().UTC(), nil
			n.Attempt = strconv.FormatUint(rand.Uint64(), 36)
			data, err := json.Marshal(n)
			if err != nil {
				return ControllerAnswer{}, err
			}
			rctx, cancel := s.reqCtx(ctx)
			start := time.Now()
			resp, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
				Then(clientv3.OpPut(key, string(data))).Commit()
			cancel()
			s.metrics.observe("txn", start)
			if err != nil {
				return ControllerAnswer{}, fmt.Errorf("%w: write controller request: %w", ErrUnavailable, err)
			}
			if !resp.Succeeded {
				continue
			}
			mine, rev = &n, resp.Header.Revision
		}
		if claimOp {
			s.noteRequested(key, true)
		}
		ans, rev, err := s.awaitAnswer(ctx, key, mine.Attempt, rev)
		if err != nil {
			return ControllerAnswer{}, err
		}
		if ans == nil {
			continue // replaced by another request for the call: ask again
		}
		if claimOp {
			s.noteRequested(key, (&ControllerRequest{Op: req.Op, Answer: ans}).binds())
		}
		if !claimOp || (req.Op == OpUnpublish && ans.Code == 0) {
			s.consumed(ctx, key, rev)
		}
		return *ans, nil
	}
	return ControllerAnswer{}, fmt.Errorf("%w: the controller request of volume %q kept changing", ErrUnavailable, req.Volume)
}

// consumed removes the request at key, answered at revision rev, unless
// it changed since. A failure leaves it for the next request of the same
// call, which reads the answer again.
func (s *Session) consumed(ctx context.Context, key string, rev int64) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	_, _ = s.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key)).Commit()
	s.metrics.observe("txn", start)
}

// awaitAnswer waits for the answer to attempt on key, written after rev.
// It returns a nil answer when the key was replaced by another attempt or
// removed, and the answer's mod revision.
func (s *Session) awaitAnswer(ctx context.Context, key, attempt string, rev int64) (*ControllerAnswer, int64, error) {
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := s.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
		// Read after the watch is set up: an answer written before it
		// started is seen here, one written after in the watch.
		cur, crev, err := s.readRequest(ctx, key)
		if err != nil {
			cancel()
			return nil, 0, err
		}
		if ans, done := answerOf(cur, attempt); done {
			cancel()
			return ans, crev, nil
		}
		broke := false
		for wr := range wch {
			if wr.Err() != nil {
				broke = true
				break
			}
			for _, e := range wr.Events {
				if e.Type == clientv3.EventTypeDelete {
					cancel()
					return nil, 0, nil
				}
				var r ControllerRequest
				if json.Unmarshal(e.Kv.Value, &r) != nil {
					cancel()
					return nil, 0, nil
				}
				if ans, done := answerOf(&r, attempt); done {
					cancel()
					return ans, e.Kv.ModRevision, nil
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		if broke {
			s.log.Debug("controller answer watch broke; reading again")
		}
		rev = crev
	}
}

// answerOf says whether r ends the wait for attempt: answered (the
// answer), or replaced (nil).
func answerOf(r *ControllerRequest, attempt string) (*ControllerAnswer, bool) {
	switch {
	case r == nil || r.Attempt != attempt:
		return nil, true
	case r.Answer != nil:
		return r.Answer, true
	}
	return nil, false
}

// ControllerHandler runs the controller steps of one plugin on the host
// that leads its controller.
type ControllerHandler interface {
	// Handle runs req's step on this host's controller and returns the
	// plugin's answer. It returns when ctx ends (leadership lost), and
	// its answer is then dropped: the next leader runs the step.
	Handle(ctx context.Context, req ControllerRequest) ControllerAnswer
	// Lead runs for as long as this host leads, in a goroutine of its
	// own, and returns when ctx ends.
	Lead(ctx context.Context)
}

// ServeController campaigns for the leadership of plugin's controller
// among the hosts that serve it, and while this host leads, runs every
// pending and new request of the plugin through h (each volume and node's
// requests one at a time, in order) and writes back the answers; a request
// answered by a leader that lost its leadership meanwhile is not answered
// (the next leader runs it). On election it runs every request still
// pending. It campaigns again when its election session ends (etcd was
// unreachable for a TTL) and returns when ctx ends, having resigned.
func (s *Session) ServeController(ctx context.Context, plugin string, h ControllerHandler) {
	for ctx.Err() == nil {
		if err := s.leadOnce(ctx, plugin, h); err != nil && ctx.Err() == nil {
			s.log.WithError(err).WithField("plugin", plugin).Warn("controller election failed; campaigning again")
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (s *Session) leadOnce(ctx context.Context, plugin string, h ControllerHandler) error {
	ttl := int((s.TTL() + time.Second - 1) / time.Second)
	cs, err := concurrency.NewSession(s.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("election session: %w", err)
	}
	defer func() {
		// Revoked at once, so that the next leader need not wait a TTL
		// (unless etcd is unreachable: then it expires on its own).
		cs.Orphan()
		_ = s.revoke(context.Background(), cs.Lease())
	}()
	key, rev, err := s.campaign(ctx, s.leaderPrefix(plugin), cs.Lease())
	if err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	go func() {
		select {
		case <-cs.Done():
			lcancel()
		case <-lctx.Done():
		}
	}()
	log := s.log.WithField("plugin", plugin)
	log.Info("leading the controller of the plugin in the cluster")
	s.metrics.leader.WithLabelValues(plugin).Set(1)
	defer s.metrics.leader.WithLabelValues(plugin).Set(0)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.Lead(lctx)
	}()
	l := &leadership{s: s, plugin: plugin, key: key, rev: rev, h: h, ctx: lctx, cancel: lcancel, running: map[string]bool{}, dirty: map[string]bool{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.sweepEvery()
	}()
	l.serve()
	lcancel()
	l.wg.Wait()
	wg.Wait()
	if ctx.Err() == nil {
		log.Warn("lost the leadership of the plugin's controller")
	}
	return nil
}

// campaign puts this host's key under prefix, on lease, and waits until
// it is the oldest key there: this host leads. It returns the key and its
// create revision. Every request ends with ctx. (The concurrency
// package's Election.Campaign resigns with the client's own context when
// ctx ends, which blocks a shutdown for as long as etcd is unreachable;
// the caller revokes lease instead, which removes the key.)
func (s *Session) campaign(ctx context.Context, prefix string, lease clientv3.LeaseID) (string, int64, error) {
	key := fmt.Sprintf("%s/%x", prefix, lease)
	start := time.Now()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, s.cfg.NodeID, clientv3.WithLease(lease))).Else(clientv3.OpGet(key)).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return "", 0, err
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		rev = resp.Responses[0].GetResponseRange().GetKvs()[0].CreateRevision
	}
	for {
		// The newest key older than this one: wait for it to go.
		opts := append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev - 1)}, clientv3.WithLastCreate()...)
		start := time.Now()
		g, err := s.cli.Get(ctx, prefix+"/", opts...)
		s.metrics.observe("get", start)
		if err != nil {
			return "", 0, err
		}
		if len(g.Kvs) == 0 {
			return key, rev, nil
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range s.cli.Watch(wctx, string(g.Kvs[0].Key), clientv3.WithRev(g.Header.Revision+1)) {
			if wr.Err() != nil || slices.ContainsFunc(wr.Events, func(e *clientv3.Event) bool { return e.Type == clientv3.EventTypeDelete }) {
				break
			}
		}
		cancel()
		if ctx.Err() != nil {
			return "", 0, ctx.Err()
		}
	}
}

// leadership is one term of this host as a plugin's controller leader.
type leadership struct {
	s      *Session
	plugin string
	// key is this host's election key and rev its create revision: an
	// answer is written only while they are unchanged.
	key    string
	rev    int64
	h      ControllerHandler
	ctx    context.Context
	cancel context.CancelFunc // ends the term
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool // guarded by mu; keys with a worker
	dirty   map[string]bool // guarded by mu; keys changed while their worker ran
}

// serve lists the pending requests, then follows new ones, until the
// leadership ends.
func (l *leadership) serve() {
	s, prefix := l.s, l.s.controllerPrefix(l.plugin)
	for l.ctx.Err() == nil {
		rctx, cancel := s.reqCtx(l.ctx)
		start := time.Now()
		resp, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix())
		cancel()
		s.metrics.observe("get", start)
		if err != nil {
			t := time.NewTimer(250 * time.Millisecond)
			select {
			case <-l.ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		for _, kv := range resp.Kvs {
			if pendingValue(kv.Value) {
				l.dispatch(string(kv.Key))
			}
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(l.ctx))
		for wr := range s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, e := range wr.Events {
				if e.Type == clientv3.EventTypePut && pendingValue(e.Kv.Value) {
					l.dispatch(string(e.Kv.Key))
				}
			}
		}
		wcancel()
	}
}

// sweepEvery removes, at the start of the term and then every quarter of
// the retention, the answers to one-shot requests older than
// Config.AnswerRetention: their requesters never read them.
func (l *leadership) sweepEvery() {
	every := l.s.cfg.AnswerRetention / 4
	for {
		if err := l.sweep(time.Now()); err != nil && l.ctx.Err() == nil {
			l.s.log.WithError(err).WithField("plugin", l.plugin).Warn("cannot remove old controller answers; trying again later")
		}
		t := time.NewTimer(every)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// sweep removes the answered one-shot requests of the plugin written
// before now less the retention, each unless it changed since it was
// read. A removed answer to a create is logged: the plugin may hold a
// volume or snapshot nobody recorded.
func (l *leadership) sweep(now time.Time) error {
	s := l.s
	rctx, cancel := s.reqCtx(l.ctx)
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.controllerPrefix(l.plugin)+"~", clientv3.WithPrefix())
	cancel()
	s.metrics.observe("get", start)
	if err != nil {
		return fmt.Errorf("%w: list controller requests: %w", ErrUnavailable, err)
	}
	for _, kv := range resp.Kvs {
		var r ControllerRequest
		if json.Unmarshal(kv.Value, &r) != nil || r.Answer == nil || isClaimOp(r.Op) || now.Sub(r.At) < s.cfg.AnswerRetention {
			continue
		}
		rctx, cancel := s.reqCtx(l.ctx)
		start := time.Now()
		d, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return fmt.Errorf("%w: remove an old controller answer: %w", ErrUnavailable, err)
		}
		if !d.Succeeded {
			continue
		}
		log := s.log.WithFields(logrus.Fields{"plugin": l.plugin, "op": r.Op, "subject": r.Volume, "host": r.Host, "asked": r.At.Format(time.RFC3339)})
		if r.Answer.Code == 0 && (r.Op == OpCreateVolume || r.Op == OpCreateSnapshot) {
			log.Warn("removed the answer to a controller request its host never read: the plugin may hold what it created for it, recorded nowhere")
		} else {
			log.Info("removed the answer to a controller request its host never read")
		}
	}
	return nil
}

func pendingValue(v []byte) bool {
	var r ControllerRequest
	return json.Unmarshal(v, &r) == nil && r.Answer == nil
}

// dispatch starts key's worker, or tells the running one to read it again.
func (l *leadership) dispatch(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running[key] {
		l.dirty[key] = true
		return
	}
	l.running[key] = true
	l.wg.Add(1)
	go l.work(key)
}

// work runs key's pending request and writes back the answer, until the
// key holds no pending request.
func (l *leadership) work(key string) {
	defer l.wg.Done()
	for {
		for l.ctx.Err() == nil {
			done, err := l.runOnce(key)
			if err == nil && done {
				break
			}
			if err != nil && l.ctx.Err() == nil {
				l.s.log.WithError(err).WithField("plugin", l.plugin).Warn("cannot answer a controller request; retrying")
				t := time.NewTimer(250 * time.Millisecond)
				select {
				case <-l.ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		}
		l.mu.Lock()
		if l.dirty[key] && l.ctx.Err() == nil {
			delete(l.dirty, key)
			l.mu.Unlock()
			continue
		}
		delete(l.dirty, key)
		delete(l.running, key)
		l.mu.Unlock()
		return
	}
}

// runOnce runs key's request if it is pending; done says there is nothing
// (more) to run.
func (l *leadership) runOnce(key string) (done bool, err error) {
	s := l.s
	r, rev, err := s.readRequest(l.ctx, key)
	if err != nil {
		return false, err
	}
	if r == nil || r.Answer != nil {
		return true, nil
	}
	ans := l.h.Handle(l.ctx, *r)
	if l.ctx.Err() != nil {
		return true, nil // the next leader runs it
	}
	ans.By, ans.Attempt = s.cfg.NodeID, r.Attempt
	r.Answer = &ans
	data, err := json.Marshal(r)
	if err != nil {
		return true, err
	}
	rctx, cancel := s.reqCtx(l.ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Txn(rctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", rev),
		clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev),
	).Then(clientv3.OpPut(key, string(data))).Else(clientv3.OpGet(l.key)).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return false, fmt.Errorf("%w: answer controller request: %w", ErrUnavailable, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != l.rev {
			// The election key is gone: this term is over even if the
			// session has not noticed yet.
			l.cancel()
			return true, nil
		}
	}
	result := "ok"
	if ans.Code != 0 {
		result = "error"
	}
	if resp.Succeeded {
		s.metrics.served.WithLabelValues(r.Op, result).Inc()
	}
	// Not succeeded: the request changed meanwhile; read it again.
	return resp.Succeeded, nil
}

// ControllerInfo is what the hosts with a controller of a plugin tell
// those without one, under <prefix>/plugins/<plugin>.
type ControllerInfo struct {
	// ControllerRequired: the plugin's controller has
	// PUBLISH_UNPUBLISH_VOLUME, so its claims go through
	// ControllerPublishVolume.
	ControllerRequired bool `json:"controller_required"`
	// The controller's capabilities behind the operations other hosts
	// send to the leader: EXPAND_VOLUME, CLONE_VOLUME,
	// CREATE_DELETE_SNAPSHOT and MODIFY_VOLUME.
	ControllerExpand     bool `json:"controller_expand,omitempty"`
	CloneVolume          bool `json:"clone_volume,omitempty"`
	CreateDeleteSnapshot bool `json:"create_delete_snapshot,omitempty"`
	ControllerModify     bool `json:"controller_modify,omitempty"`
	// By is the host that last wrote it, At when.
	By string    `json:"by"`
	At time.Time `json:"at"`
}

func (s *Session) pluginKey(plugin string) string { return s.key("plugins", url.PathEscape(plugin)) }

// PutControllerInfo records info, what this host's controller of plugin
// says, for the hosts without one (its By and At are set here).
func (s *Session) PutControllerInfo(ctx context.Context, plugin string, info ControllerInfo) error {
	info.By, info.At = s.cfg.NodeID, time.Now().UTC()
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	_, err = s.cli.Put(rctx, s.pluginKey(plugin), string(data))
	s.metrics.observe("put", start)
	if err != nil {
		return fmt.Errorf("%w: record the controller of plugin %q: %w", ErrUnavailable, plugin, err)
	}
	return nil
}

// PluginControllerInfo returns what a host with a controller of plugin
// recorded last; ok is false when none ever did.
func (s *Session) PluginControllerInfo(ctx context.Context, plugin string) (info ControllerInfo, ok bool, err error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.pluginKey(plugin))
	s.metrics.observe("get", start)
	if err != nil {
		return info, false, fmt.Errorf("%w: read the controller of plugin %q: %w", ErrUnavailable, plugin, err)
	}
	if len(resp.Kvs) == 0 {
		return info, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		return info, false, fmt.Errorf("decode the controller of plugin %q: %w", plugin, err)
	}
	return info, true, nil
}
