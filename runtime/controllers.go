package runtime

import (
	"context"
	"errors"
	"fmt"
	"github.com/csiactor/csiactor/internal/seal"
	"github.com/csiactor/csiactor/internal/secretfile"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
)

// clusterPlugins is the volume and snapshot managers' claim.Plugins in
// cluster mode. It answers as the local pluginsAdapter does, except for
// three things:
//
//   - A claim step's ControllerPublishVolume or ControllerUnpublishVolume
//     on a host without a healthy controller allocation of the plugin goes
//     to the plugin's controller leader in the cluster (a host with one,
//     elected in etcd), which runs it with this host's node ID and writes
//     back the answer; so do the later ones of the volume while that
//     request is pending or the leader published the volume for this
//     host, until an unpublish there succeeded, even once the host has a
//     controller of its own.
//   - So do, on a host without a healthy controller allocation of the
//     plugin, CreateVolume (restores and clones too), DeleteVolume,
//     ControllerExpandVolume, ControllerModifyVolume,
//     ValidateVolumeCapabilities, CreateSnapshot
//     and DeleteSnapshot; the controller's facts (its capabilities) are
//     then those the hosts with a controller recorded in etcd. Other
//     controller calls (capacity, listings, health) stay local.
//   - A node plugin that says the plugin has a controller service, on a
//     host without a controller allocation, cannot know whether the
//     controller publishes volumes (PUBLISH_UNPUBLISH_VOLUME): the hosts
//     with a controller record that in etcd, and the facts take it from
//     there. Until some host did, claims of the plugin fail as unavailable
//     rather than skip ControllerPublishVolume.
type clusterPlugins struct {
	local      *pluginsAdapter
	s          *cluster.Session
	keys       *seal.Keyring // seals the secrets of requests; nil: none
	rpcTimeout time.Duration
	ttl        time.Duration
	now        func() time.Time

	mu    sync.Mutex
	infos map[string]cachedInfo // guarded by mu; by plugin
}

type cachedInfo struct {
	info    cluster.ControllerInfo
	expires time.Time
}

var _ claim.CachedPlugins = (*clusterPlugins)(nil)

func newClusterPlugins(local *pluginsAdapter, s *cluster.Session, keys *seal.Keyring, rpcTimeout, ttl time.Duration) *clusterPlugins {
	return &clusterPlugins{local: local, s: s, keys: keys, rpcTimeout: rpcTimeout, ttl: ttl, now: time.Now, infos: map[string]cachedInfo{}}
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
	if _, step := claim.StepFrom(ctx); typ == claim.ControllerPlugin && !step && err != nil {
		return p.routed(ctx, name, err)
	}
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

// routed is Client for a controller call other than a claim step's on a
// host without a usable controller of plugin (localErr says why): a
// client that sends the call to the plugin's controller leader, with the
// controller facts the cluster recorded. With no leader, or no record
// yet, it fails as unavailable, naming the plugin: with no leader while
// the cluster has a record (the controller of some host is restarting,
// say), as a *registry.UnhealthyError, which a volume request waits out
// (volumes.plugin_wait).
func (p *clusterPlugins) routed(ctx context.Context, name string, localErr error) (csi.Client, claim.Facts, error) {
	if _, err := p.s.ControllerLeader(ctx, name); err != nil {
		err = fmt.Errorf("%w; %w", localErr, err)
		if errors.Is(err, cluster.ErrNoController) {
			if _, known, ierr := p.info(ctx, name); ierr == nil && known {
				return nil, claim.Facts{}, &registry.UnhealthyError{Plugin: name, Role: plugin.Controller, Msg: err.Error()}
			}
		}
		return nil, claim.Facts{}, err
	}
	info, ok, err := p.info(ctx, name)
	if err != nil {
		return nil, claim.Facts{}, err
	}
	if !ok {
		return nil, claim.Facts{}, fmt.Errorf("%w; no host of the cluster with a controller of plugin %q has recorded its capabilities yet", localErr, name)
	}
	// The node plugin's facts where this host has one (topology,
	// capabilities), with the controller's as the cluster recorded them.
	_, facts, nerr := p.local.Client(ctx, name, claim.NodePlugin)
	if nerr != nil {
		facts = claim.Facts{}
	}
	facts.ControllerService = true
	facts.ControllerRequired = info.ControllerRequired
	facts.ControllerExpand = info.ControllerExpand
	facts.CloneVolume = info.CloneVolume
	facts.CreateDeleteSnapshot = info.CreateDeleteSnapshot
	facts.ControllerModify = info.ControllerModify
	facts.ListSnapshots, facts.ControllerCondition, facts.ControllerHealth = false, false, false
	return &remoteController{p: p, plugin: name}, facts, nil
}

// info returns the cluster's record of plugin's controller, from the
// cache while it is fresh.
func (p *clusterPlugins) info(ctx context.Context, name string) (cluster.ControllerInfo, bool, error) {
	if info, ok := p.cachedInfo(name); ok {
		return info, true, nil
	}
	info, ok, err := p.s.PluginControllerInfo(ctx, name)
	if err != nil || !ok {
		return info, ok, err
	}
	p.mu.Lock()
	p.infos[name] = cachedInfo{info: info, expires: p.now().Add(p.ttl)}
	p.mu.Unlock()
	return info, true, nil
}

// needsInfo says whether facts leave ControllerRequired to the cluster.
func needsInfo(f claim.Facts) bool { return f.ControllerService && !f.ControllerRequired }

// adjust sets facts.ControllerRequired from the cluster's record when this
// host cannot tell.
func (p *clusterPlugins) adjust(ctx context.Context, name string, facts claim.Facts) (claim.Facts, error) {
	if !needsInfo(facts) {
		return facts, nil
	}
	info, ok, err := p.info(ctx, name)
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
	facts.ControllerRequired = info.ControllerRequired
	return facts, nil
}

func (p *clusterPlugins) cachedInfo(name string) (cluster.ControllerInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.infos[name]
	if !ok || !p.now().Before(e.expires) {
		return cluster.ControllerInfo{}, false
	}
	return e.info, true
}

// CachedClient is the local CachedClient, with the node facts adjusted as
// Client does when the cluster's record is at hand.
func (p *clusterPlugins) CachedClient(name string, typ claim.PluginType) (csi.Client, claim.Facts, bool) {
	c, facts, ok := p.local.CachedClient(name, typ)
	if !ok || typ == claim.ControllerPlugin || !needsInfo(facts) {
		return c, facts, ok
	}
	info, ok := p.cachedInfo(name)
	if !ok {
		return nil, claim.Facts{}, false
	}
	facts.ControllerRequired = info.ControllerRequired
	return c, facts, true
}

// Refingerprint asks this host's node allocations of plugin name to
// fingerprint now: the node volume limit is this host's.
func (p *clusterPlugins) Refingerprint(name string) { p.local.Refingerprint(name) }

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

// remoteController is the client of a controller call on a host without
// a healthy controller of the plugin (see clusterPlugins): the calls it
// serves go to the plugin's controller leader through etcd, each request
// without its secrets in Body and with them apart in Secrets. Client
// hands it out only for those calls, and for a claim step only with
// volume set (the volume's ID in the cluster).
type remoteController struct {
	csi.Client // nil: calling anything else panics
	p          *clusterPlugins
	plugin     string
	volume     string
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// requestRecord names a controller request's secrets when they are sealed
// (seal's additional data), so that they open for that request only.
func requestRecord(op, subject string) string { return "controller/" + op + "/" + subject }

// call sends req (with its secrets cleared; secrets are sent apart) as
// op of subject to the leader, and decodes its answer into resp.
func (c *remoteController) call(ctx context.Context, op, subject, node string, req proto.Message, secrets map[string]string, resp proto.Message) (cluster.ControllerAnswer, error) {
	body, err := deterministic.Marshal(req)
	if err != nil {
		return cluster.ControllerAnswer{}, fmt.Errorf("encode the %s request: %w", op, err)
	}
	creq := cluster.ControllerRequest{Volume: subject, Node: node, Op: op, Body: body, Secrets: secrets}
	if ref := secretfile.RefFrom(ctx); ref != "" {
		// Read from a file: the leader reads the reference on its host.
		creq.Secrets, creq.SecretsFrom = nil, ref
	} else if keys := c.p.keys; keys.Enabled() && len(secrets) > 0 {
		// Sealed like every secret at rest, for the leader, which has
		// the same key, to open.
		record := requestRecord(op, subject)
		creq.Secrets, creq.SecretsDigest = keys.SealMap(record, secrets), keys.Digest(record, secrets)
	}
	ans, err := c.p.request(ctx, c.plugin, creq)
	if err != nil {
		return ans, err
	}
	if resp != nil {
		if err := proto.Unmarshal(ans.Body, resp); err != nil {
			return ans, status.Errorf(codes.Internal, "undecodable %s answer from the controller of host %s", op, ans.By)
		}
	}
	return ans, nil
}

func (c *remoteController) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	ans, err := c.call(ctx, cluster.OpPublish, c.volume, req.GetNodeId(), r, req.GetSecrets(), nil)
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: ans.PublishContext}, nil
}

func (c *remoteController) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) error {
	r := proto.CloneOf(req)
	r.Secrets = nil
	_, err := c.call(ctx, cluster.OpUnpublish, c.volume, req.GetNodeId(), r, req.GetSecrets(), nil)
	return err
}

func (c *remoteController) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	resp := &csipb.CreateVolumeResponse{}
	if _, err := c.call(ctx, cluster.OpCreateVolume, req.GetName(), "", r, req.GetSecrets(), resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *remoteController) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) error {
	r := proto.CloneOf(req)
	r.Secrets = nil
	_, err := c.call(ctx, cluster.OpDeleteVolume, req.GetVolumeId(), "", r, req.GetSecrets(), nil)
	return err
}

func (c *remoteController) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	resp := &csipb.ControllerExpandVolumeResponse{}
	if _, err := c.call(ctx, cluster.OpExpandVolume, req.GetVolumeId(), "", r, req.GetSecrets(), resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *remoteController) ControllerModifyVolume(ctx context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	resp := &csipb.ControllerModifyVolumeResponse{}
	if _, err := c.call(ctx, cluster.OpModifyVolume, req.GetVolumeId(), "", r, req.GetSecrets(), resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *remoteController) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	resp := &csipb.ValidateVolumeCapabilitiesResponse{}
	if _, err := c.call(ctx, cluster.OpValidateVolume, req.GetVolumeId(), "", r, req.GetSecrets(), resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *remoteController) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	r := proto.CloneOf(req)
	r.Secrets = nil
	resp := &csipb.CreateSnapshotResponse{}
	if _, err := c.call(ctx, cluster.OpCreateSnapshot, req.GetName(), "", r, req.GetSecrets(), resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *remoteController) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) error {
	r := proto.CloneOf(req)
	r.Secrets = nil
	_, err := c.call(ctx, cluster.OpDeleteSnapshot, req.GetSnapshotId(), "", r, req.GetSecrets(), nil)
	return err
}

// The controller calls a remoteController does not route: they stay
// local, and this host has no controller to run them.
func (c *remoteController) unrouted(method string) error {
	return status.Errorf(codes.Unavailable, "%s: this host has no healthy controller of plugin %q, and %s runs only on a host that has one",
		method, c.plugin, method)
}

func (c *remoteController) ControllerCapabilities(context.Context) (csi.ControllerCapabilities, error) {
	return csi.ControllerCapabilities{}, c.unrouted("ControllerGetCapabilities")
}

func (c *remoteController) GetCapacity(context.Context, *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	return nil, c.unrouted("GetCapacity")
}

func (c *remoteController) ListVolumes(context.Context, *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	return nil, c.unrouted("ListVolumes")
}

func (c *remoteController) ListSnapshots(context.Context, *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	return nil, c.unrouted("ListSnapshots")
}

func (c *remoteController) ControllerGetVolume(context.Context, *csipb.ControllerGetVolumeRequest) (csi.VolumeHealth, error) {
	return csi.VolumeHealth{}, c.unrouted("ControllerGetVolume")
}

func (c *remoteController) ControllerGetVolumeHealth(context.Context, *csipb.ControllerGetVolumeHealthRequest) (csi.VolumeCondition, error) {
	return csi.VolumeCondition{}, c.unrouted("ControllerGetVolumeHealth")
}

// controllerHandler runs, on the plugin's controller leader, the
// controller calls other hosts ask for, and fences down hosts
// automatically (cluster.fence_after).
type controllerHandler struct {
	r      *Runtime
	plugin string
	log    *logrus.Entry
	// slots bounds the requests of other hosts in flight to the
	// plugin (plugins.max_in_flight), beside this host's own calls.
	slots chan struct{}
}

// routedOp is how the leader runs one operation of a ControllerRequest.
type routedOp struct {
	method string
	// run decodes body, sets secrets (when the request carries them
	// apart), and calls c.
	run func(ctx context.Context, c csi.Client, body []byte, secrets map[string]string) (proto.Message, error)
}

// routed builds a routedOp for the request type Req.
func routed[Req proto.Message](method string, secrets func(Req) *map[string]string,
	call func(context.Context, csi.Client, Req) (proto.Message, error)) routedOp {
	return routedOp{method: method, run: func(ctx context.Context, c csi.Client, body []byte, sec map[string]string) (proto.Message, error) {
		var zero Req
		req := zero.ProtoReflect().New().Interface().(Req)
		if err := proto.Unmarshal(body, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "undecodable %s request", method)
		}
		if len(sec) > 0 {
			*secrets(req) = sec
		}
		return call(ctx, c, req)
	}}
}

// routedOps are the operations a controller leader runs for other hosts.
var routedOps = map[string]routedOp{
	cluster.OpPublish: routed("ControllerPublishVolume", func(r *csipb.ControllerPublishVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.ControllerPublishVolumeRequest) (proto.Message, error) {
			return c.ControllerPublishVolume(ctx, r)
		}),
	cluster.OpUnpublish: routed("ControllerUnpublishVolume", func(r *csipb.ControllerUnpublishVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.ControllerUnpublishVolumeRequest) (proto.Message, error) {
			return nil, c.ControllerUnpublishVolume(ctx, r)
		}),
	cluster.OpCreateVolume: routed("CreateVolume", func(r *csipb.CreateVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.CreateVolumeRequest) (proto.Message, error) {
			return c.CreateVolume(ctx, r)
		}),
	cluster.OpDeleteVolume: routed("DeleteVolume", func(r *csipb.DeleteVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.DeleteVolumeRequest) (proto.Message, error) {
			return nil, c.DeleteVolume(ctx, r)
		}),
	cluster.OpExpandVolume: routed("ControllerExpandVolume", func(r *csipb.ControllerExpandVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.ControllerExpandVolumeRequest) (proto.Message, error) {
			return c.ControllerExpandVolume(ctx, r)
		}),
	cluster.OpModifyVolume: routed("ControllerModifyVolume", func(r *csipb.ControllerModifyVolumeRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.ControllerModifyVolumeRequest) (proto.Message, error) {
			return c.ControllerModifyVolume(ctx, r)
		}),
	cluster.OpValidateVolume: routed("ValidateVolumeCapabilities", func(r *csipb.ValidateVolumeCapabilitiesRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.ValidateVolumeCapabilitiesRequest) (proto.Message, error) {
			return c.ValidateVolumeCapabilities(ctx, r)
		}),
	cluster.OpCreateSnapshot: routed("CreateSnapshot", func(r *csipb.CreateSnapshotRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.CreateSnapshotRequest) (proto.Message, error) {
			return c.CreateSnapshot(ctx, r)
		}),
	cluster.OpDeleteSnapshot: routed("DeleteSnapshot", func(r *csipb.DeleteSnapshotRequest) *map[string]string { return &r.Secrets },
		func(ctx context.Context, c csi.Client, r *csipb.DeleteSnapshotRequest) (proto.Message, error) {
			return nil, c.DeleteSnapshot(ctx, r)
		}),
}

// Handle runs req on this host's controller of the plugin.
func (h *controllerHandler) Handle(ctx context.Context, req cluster.ControllerRequest) cluster.ControllerAnswer {
	op, ok := routedOps[req.Op]
	if !ok {
		return cluster.ControllerAnswer{Code: uint32(codes.InvalidArgument), Message: fmt.Sprintf("unknown controller request op %q", req.Op)}
	}
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-ctx.Done():
		return cluster.ControllerAnswer{Code: uint32(codes.Canceled), Message: "the controller leader stopped"}
	}
	log := h.log.WithFields(logrus.Fields{"subject": req.Volume, "host": req.Host, "op": req.Op})
	if req.Node != "" {
		log = log.WithField("csi_node", req.Node)
	}
	c, _, err := h.r.plugins.Client(ctx, h.plugin, claim.ControllerPlugin)
	if err != nil {
		return cluster.ControllerAnswer{Code: uint32(codes.Unavailable),
			Message: fmt.Sprintf("the controller leader has no healthy controller of plugin %q now: %s", h.plugin, err)}
	}
	secrets := req.Secrets
	if req.SecretsFrom != "" {
		if secrets, err = secretfile.Read(req.SecretsFrom); err != nil {
			// Retried: the file may appear on this host.
			return cluster.ControllerAnswer{Code: uint32(codes.Aborted),
				Message: fmt.Sprintf("the controller leader cannot read the request's secrets: %s", err)}
		}
	} else if req.SecretsDigest != "" {
		if secrets, err = h.r.keys.OpenMap(requestRecord(req.Op, req.Volume), req.Secrets); err != nil {
			// Never retried with another key: the requester's differs.
			return cluster.ControllerAnswer{Code: uint32(codes.FailedPrecondition),
				Message: fmt.Sprintf("the controller leader cannot open the request's secrets: %s", err)}
		}
	}
	resp, err := op.run(ctx, c, req.Body, secrets)
	log.WithField("code", csi.Code(err).String()).Info("ran " + op.method + " for another host")
	return answerFor(err, resp)
}

// answerFor is the answer of a call that returned resp and err.
func answerFor(err error, resp proto.Message) cluster.ControllerAnswer {
	if err != nil {
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
		}
		return cluster.ControllerAnswer{Code: uint32(csi.Code(err)), Message: msg}
	}
	if pr, ok := resp.(*csipb.ControllerPublishVolumeResponse); ok {
		return cluster.ControllerAnswer{PublishContext: pr.GetPublishContext()}
	}
	if resp == nil {
		return cluster.ControllerAnswer{}
	}
	body, merr := deterministic.Marshal(resp)
	if merr != nil {
		return cluster.ControllerAnswer{Code: uint32(codes.Internal), Message: "cannot encode the answer: " + merr.Error()}
	}
	return cluster.ControllerAnswer{Body: body}
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
	recorded := map[string]cluster.ControllerInfo{}
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
				if _, f, err := r.plugins.Client(ctx, s.Name, claim.ControllerPlugin); err == nil {
					info := cluster.ControllerInfo{ControllerRequired: s.ControllerRequired, ControllerExpand: f.ControllerExpand,
						CloneVolume: f.CloneVolume, CreateDeleteSnapshot: f.CreateDeleteSnapshot, ControllerModify: f.ControllerModify}
					if v, ok := recorded[s.Name]; !ok || v != info {
						if err := r.cluster.PutControllerInfo(ctx, s.Name, info); err == nil {
							recorded[s.Name] = info
						}
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
