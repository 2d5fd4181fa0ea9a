package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
)

// clusterPlugins is the volume manager's claim.Plugins in cluster mode.
// It answers as the local pluginsAdapter does, except for two things:
//
//   - A claim step's ControllerPublishVolume or ControllerUnpublishVolume
//     on a host without a healthy controller allocation of the plugin goes
//     to the plugin's controller leader in the cluster (a host with one,
//     elected in etcd), which runs it with this host's node ID and writes
//     back the answer; so do the later ones of the volume while that
//     request is pending or the leader published the volume for this
//     host, until an unpublish there succeeded, even once the host has a
//     controller of its own. Other controller calls stay local.
//   - A node plugin that says the plugin has a controller service, on a
//     host without a controller allocation, cannot know whether the
//     controller publishes volumes (PUBLISH_UNPUBLISH_VOLUME): the hosts
//     with a controller record that in etcd, and the facts take it from
//     there. Until some host did, claims of the plugin fail as unavailable
//     rather than skip ControllerPublishVolume.
type clusterPlugins struct {
	local      *pluginsAdapter
	s          *cluster.Session
	rpcTimeout time.Duration
	ttl        time.Duration
	now        func() time.Time

	mu    sync.Mutex
	infos map[string]cachedInfo // guarded by mu; by plugin
}

type cachedInfo struct {
	controllerRequired bool
	expires            time.Time
}

var _ claim.CachedPlugins = (*clusterPlugins)(nil)

func newClusterPlugins(local *pluginsAdapter, s *cluster.Session, rpcTimeout, ttl time.Duration) *clusterPlugins {
	return &clusterPlugins{local: local, s: s, rpcTimeout: rpcTimeout, ttl: ttl, now: time.Now, infos: map[string]cachedInfo{}}
}

// isControllerStep says whether ctx carries a claim step that may run on
// another host's controller.
func isControllerStep(ctx context.Context) (claim.Step, bool) {
	s, ok := claim.StepFrom(ctx)
	return s, ok && (s.Method == claim.ControllerPublish || s.Method == claim.ControllerUnpublish)
}

// Client is the local Client, but for the controller steps of a host
// without a healthy controller (see clusterPlugins).
func (p *clusterPlugins) Client(ctx context.Context, name string, typ claim.PluginType) (csi.Client, claim.Facts, error) {
	c, facts, err := p.local.Client(ctx, name, typ)
	if typ == claim.ControllerPlugin {
		step, ok := isControllerStep(ctx)
		// A volume with a request of this host still in etcd stays with
		// the leader (see cluster.Session.ControllerRequested).
		sticky := ok && p.s.ControllerRequested(name, step.Volume)
		if err == nil && !sticky {
			return c, facts, nil
		}
		if !ok {
			return nil, claim.Facts{}, err
		}
		if _, lerr := p.s.ControllerLeader(ctx, name); lerr != nil {
			if err == nil {
				err = fmt.Errorf("the controller steps of volume %q go through the controller leader of plugin %q while this host's request there is pending or published", step.Volume, name)
			}
			return nil, claim.Facts{}, fmt.Errorf("%w; %w", err, lerr)
		}
		return &remoteController{p: p, plugin: name, volume: step.Volume}, facts, nil
	}
	if err != nil {
		return nil, claim.Facts{}, err
	}
	facts, err = p.adjust(ctx, name, facts)
	if err != nil {
		return nil, claim.Facts{}, err
	}
	return c, facts, nil
}

// needsInfo says whether facts leave ControllerRequired to the cluster.
func needsInfo(f claim.Facts) bool { return f.ControllerService && !f.ControllerRequired }

// adjust sets facts.ControllerRequired from the cluster's record when this
// host cannot tell.
func (p *clusterPlugins) adjust(ctx context.Context, name string, facts claim.Facts) (claim.Facts, error) {
	if !needsInfo(facts) {
		return facts, nil
	}
	if req, ok := p.cachedInfo(name); ok {
		facts.ControllerRequired = req
		return facts, nil
	}
	info, ok, err := p.s.PluginControllerInfo(ctx, name)
	if err != nil {
		return facts, err
	}
	if !ok {
		if _, _, lerr := p.local.Client(ctx, name, claim.ControllerPlugin); !errors.Is(lerr, registry.ErrPluginNotFound) {
			return facts, nil // this host's own controller decides
		}
		return facts, fmt.Errorf("%w: plugin %q has a controller service, and no host of the cluster has a controller of it yet to tell whether its volumes need ControllerPublishVolume; start a controller allocation of it on some host",
			registry.ErrNoHealthyPlugin, name)
	}
	p.mu.Lock()
	p.infos[name] = cachedInfo{controllerRequired: info.ControllerRequired, expires: p.now().Add(p.ttl)}
	p.mu.Unlock()
	facts.ControllerRequired = info.ControllerRequired
	return facts, nil
}

func (p *clusterPlugins) cachedInfo(name string) (bool, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.infos[name]
	if !ok || !p.now().Before(e.expires) {
		return false, false
	}
	return e.controllerRequired, true
}

// CachedClient is the local CachedClient, with the node facts adjusted as
// Client does when the cluster's record is at hand.
func (p *clusterPlugins) CachedClient(name string, typ claim.PluginType) (csi.Client, claim.Facts, bool) {
	c, facts, ok := p.local.CachedClient(name, typ)
	if !ok || typ == claim.ControllerPlugin || !needsInfo(facts) {
		return c, facts, ok
	}
	req, ok := p.cachedInfo(name)
	if !ok {
		return nil, claim.Facts{}, false
	}
	facts.ControllerRequired = req
	return c, facts, true
}

// WaitHealthy waits for a healthy local allocation; for the controller,
// a controller leader anywhere in the cluster will do too.
func (p *clusterPlugins) WaitHealthy(ctx context.Context, name string, typ claim.PluginType) error {
	if typ != claim.ControllerPlugin {
		return p.local.WaitHealthy(ctx, name, typ)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		results <- p.local.WaitHealthy(wctx, name, typ)
	}()
	go func() {
		defer wg.Done()
		results <- p.s.WaitControllerLeader(wctx, name)
	}()
	defer wg.Wait()
	var last error
	for range 2 {
		if last = <-results; last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return last
}

// request asks the plugin's controller leader to run req and turns its
// answer into what a local call would have returned: the plugin's gRPC
// status, or Unavailable when no host leads the controller or etcd does
// not answer, or DeadlineExceeded after the RPC timeout (the claim steps
// retry these, asking again).
func (p *clusterPlugins) request(ctx context.Context, plugin string, req cluster.ControllerRequest) (cluster.ControllerAnswer, error) {
	rctx, cancel := context.WithTimeout(ctx, p.rpcTimeout)
	defer cancel()
	ans, err := p.s.RequestController(rctx, plugin, req)
	switch {
	case err == nil && ans.Code == uint32(codes.OK):
		return ans, nil
	case err == nil:
		return ans, status.Error(codes.Code(ans.Code), fmt.Sprintf("%s (on the controller of host %s)", ans.Message, ans.By))
	case errors.Is(err, cluster.ErrNoController), errors.Is(err, cluster.ErrUnavailable), errors.Is(err, cluster.ErrClosed):
		return ans, &clusterCallError{code: codes.Unavailable, err: err}
	case ctx.Err() != nil:
		return ans, ctx.Err()
	case rctx.Err() != nil:
		return ans, status.Errorf(codes.DeadlineExceeded, "%s of volume %q: no answer from the controller leader of plugin %q within %s",
			req.Op, req.Volume, plugin, p.rpcTimeout)
	}
	return ans, err
}

// remoteController is the client a controller step gets on a host without
// a healthy controller of the plugin: its ControllerPublishVolume and
// ControllerUnpublishVolume go to the plugin's controller leader through
// etcd. It serves no other call (Client never hands it out for one).
type remoteController struct {
	csi.Client // nil: calling anything else panics
	p          *clusterPlugins
	plugin     string
	volume     string
}

var deterministic = proto.MarshalOptions{Deterministic: true}

func (c *remoteController) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	body, err := deterministic.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode ControllerPublishVolume: %w", err)
	}
	ans, err := c.p.request(ctx, c.plugin, cluster.ControllerRequest{Volume: c.volume, Node: req.GetNodeId(), Op: cluster.OpPublish, Body: body})
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: ans.PublishContext}, nil
}

func (c *remoteController) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) error {
	body, err := deterministic.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode ControllerUnpublishVolume: %w", err)
	}
	_, err = c.p.request(ctx, c.plugin, cluster.ControllerRequest{Volume: c.volume, Node: req.GetNodeId(), Op: cluster.OpUnpublish, Body: body})
	return err
}

// controllerHandler runs, on the plugin's controller leader, the
// controller steps other hosts ask for, and fences down hosts
// automatically (cluster.fence_after).
type controllerHandler struct {
	r      *Runtime
	plugin string
	log    *logrus.Entry
	// slots bounds the requests of other hosts in flight to the
	// plugin (plugins.max_in_flight), beside this host's own calls.
	slots chan struct{}
}

// Handle runs req on this host's controller of the plugin.
func (h *controllerHandler) Handle(ctx context.Context, req cluster.ControllerRequest) cluster.ControllerAnswer {
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-ctx.Done():
		return cluster.ControllerAnswer{Code: uint32(codes.Canceled), Message: "the controller leader stopped"}
	}
	log := h.log.WithFields(logrus.Fields{"volume": req.Volume, "csi_node": req.Node, "host": req.Host, "op": req.Op})
	c, _, err := h.r.plugins.Client(ctx, h.plugin, claim.ControllerPlugin)
	if err != nil {
		return cluster.ControllerAnswer{Code: uint32(codes.Unavailable),
			Message: fmt.Sprintf("the controller leader has no healthy controller of plugin %q now: %s", h.plugin, err)}
	}
	switch req.Op {
	case cluster.OpPublish:
		var pr csipb.ControllerPublishVolumeRequest
		if err := proto.Unmarshal(req.Body, &pr); err != nil {
			return cluster.ControllerAnswer{Code: uint32(codes.InvalidArgument), Message: "undecodable ControllerPublishVolume request"}
		}
		resp, err := c.ControllerPublishVolume(ctx, &pr)
		log.WithField("code", csi.Code(err).String()).Info("ran ControllerPublishVolume for another host")
		return answerFor(err, resp.GetPublishContext())
	case cluster.OpUnpublish:
		var ur csipb.ControllerUnpublishVolumeRequest
		if err := proto.Unmarshal(req.Body, &ur); err != nil {
			return cluster.ControllerAnswer{Code: uint32(codes.InvalidArgument), Message: "undecodable ControllerUnpublishVolume request"}
		}
		err := c.ControllerUnpublishVolume(ctx, &ur)
		log.WithField("code", csi.Code(err).String()).Info("ran ControllerUnpublishVolume for another host")
		return answerFor(err, nil)
	}
	return cluster.ControllerAnswer{Code: uint32(codes.InvalidArgument), Message: fmt.Sprintf("unknown controller request op %q", req.Op)}
}

func answerFor(err error, publishContext map[string]string) cluster.ControllerAnswer {
	if err == nil {
		return cluster.ControllerAnswer{PublishContext: publishContext}
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	return cluster.ControllerAnswer{Code: uint32(csi.Code(err)), Message: msg}
}

// Lead fences, while this host leads the plugin's controller, the claims
// on the plugin's volumes of every host that has been down for
// cluster.fence_after (counted from when this leader first saw it down).
// Without fence_after it only waits.
func (h *controllerHandler) Lead(ctx context.Context) {
	after := h.r.cfg.Cluster.FenceAfter
	if after <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(min(time.Second, after/4))
	defer t.Stop()
	downSince := map[string]time.Time{}
	self := h.r.cluster.NodeID()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hosts, err := h.r.cluster.Hosts(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for _, host := range hosts {
			if host.ID == self || host.Status == cluster.StatusUp || host.Claims == 0 {
				delete(downSince, host.ID)
				continue
			}
			since, ok := downSince[host.ID]
			if !ok {
				downSince[host.ID] = now
				continue
			}
			if now.Sub(since) < after {
				continue
			}
			res, err := h.r.fenceHost(ctx, host.ID, h.plugin)
			log := h.log.WithField("node", host.ID)
			if err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("cannot fence a down host automatically; trying again")
			}
			if len(res.Claims) > 0 {
				log.WithField("claims", len(res.Claims)).Warn("fenced a host down for longer than cluster.fence_after")
			}
		}
	}
}

// followControllers keeps this host in the controller election of every
// plugin it has a healthy controller of, and records in the cluster what
// that controller says (whether claims need ControllerPublishVolume), for
// the hosts without one. It looks again every heartbeat interval and at
// every registry change, until ctx ends; then it resigns every election.
func (r *Runtime) followControllers(ctx context.Context) {
	defer r.wg.Done()
	type serving struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	running := map[string]serving{}
	recorded := map[string]bool{}
	defer func() {
		// All at once: each resigns with an etcd request of its own.
		for _, s := range running {
			s.cancel()
		}
		for _, s := range running {
			<-s.done
		}
	}()
	t := time.NewTicker(r.cfg.Plugins.HeartbeatInterval)
	defer t.Stop()
	log := r.log.WithField("component", "cluster")
	for {
		if sums, err := r.registry.Plugins(ctx); err == nil {
			want := map[string]bool{}
			for _, s := range sums {
				if s.ControllersHealthy == 0 {
					continue
				}
				want[s.Name] = true
				if v, ok := recorded[s.Name]; !ok || v != s.ControllerRequired {
					if err := r.cluster.PutControllerInfo(ctx, s.Name, s.ControllerRequired); err == nil {
						recorded[s.Name] = s.ControllerRequired
					}
				}
				if _, ok := running[s.Name]; !ok {
					sctx, cancel := context.WithCancel(ctx)
					done := make(chan struct{})
					h := &controllerHandler{r: r, plugin: s.Name, log: log.WithField("plugin", s.Name),
						slots: make(chan struct{}, max(1, r.cfg.Plugins.MaxInFlight))}
					go func() {
						defer close(done)
						r.cluster.ServeController(sctx, s.Name, h)
					}()
					running[s.Name] = serving{cancel: cancel, done: done}
				}
			}
			for name, s := range running {
				if !want[name] {
					s.cancel()
					<-s.done
					delete(running, name)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.ctrlKick:
		}
	}
}

// kickControllers makes followControllers look again now.
func (r *Runtime) kickControllers() {
	if r.ctrlKick == nil {
		return
	}
	select {
	case r.ctrlKick <- struct{}{}:
	default:
	}
}

// clusterCallError is a controller request that got no answer from the
// cluster: its gRPC code (Unavailable) makes the claim steps retry it as
// they retry a plugin that is down, and it keeps the cluster's error for
// errors.Is.
type clusterCallError struct {
	code codes.Code
	err  error
}

func (e *clusterCallError) Error() string              { return e.err.Error() }
func (e *clusterCallError) Unwrap() error              { return e.err }
func (e *clusterCallError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }
