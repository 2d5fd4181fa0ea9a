package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/csi"
)

// pluginsAdapter gives the volume manager the registry's clients.
//
// The volume manager asks for a client before every RPC. Asking the
// registry is an actor round trip, so answers are cached per plugin and
// type. An entry is dropped:
//
//   - on every registry event that can change where operations go or what
//     the facts are (registered, deregistered, health changed, singleton or
//     active changed, and lagged, which means events were lost): the runtime
//     calls invalidate from its registry subscription;
//   - when the runtime's own RegisterAllocation or DeregisterAllocation
//     returns, so its caller never races the event;
//   - after ttl (the heartbeat interval), which bounds how stale the facts
//     can be: a fingerprint is refreshed once per heartbeat anyway.
//
// A cached client can still be closed under a caller (the allocation went
// away between the registry's change and the event reaching the cache, or
// during the call). The returned client therefore asks the registry again
// when a call fails with csi.ErrClosed, and sends the call once more to
// the allocation that serves now (CSI calls are idempotent); with none, the
// call fails as Unavailable, which the claim steps retry, rather than with
// ErrClosed, which they would take as final.
type pluginsAdapter struct {
	reg *registry.Handle
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	gen   uint64                    // guarded by mu; bumped by invalidate
	cache map[targetKey]cachedEntry // guarded by mu
}

type targetKey struct {
	plugin string
	typ    claim.PluginType
}

type cachedEntry struct {
	client  *retryingClient
	facts   claim.Facts
	expires time.Time
}

var _ claim.CachedPlugins = (*pluginsAdapter)(nil)

func newPluginsAdapter(reg *registry.Handle, ttl time.Duration) *pluginsAdapter {
	return &pluginsAdapter{reg: reg, ttl: ttl, now: time.Now, cache: map[targetKey]cachedEntry{}}
}

// Client returns the active allocation of plugin name for typ, and the
// facts a claim needs. Node facts (node ID, STAGE_UNSTAGE) come from the
// node side even when the controller is asked for, since
// ControllerPublishVolume needs the node ID.
func (p *pluginsAdapter) Client(ctx context.Context, name string, typ claim.PluginType) (csi.Client, claim.Facts, error) {
	if c, facts, ok := p.CachedClient(name, typ); ok {
		return c, facts, nil
	}
	k := targetKey{name, typ}
	p.mu.Lock()
	gen := p.gen
	p.mu.Unlock()
	c, facts, err := p.resolve(ctx, k)
	if err != nil {
		return nil, claim.Facts{}, err
	}
	rc := &retryingClient{Client: c, p: p, key: k}
	p.mu.Lock()
	if p.gen == gen { // nothing changed while the registry answered
		p.cache[k] = cachedEntry{client: rc, facts: facts, expires: p.now().Add(p.ttl)}
	}
	p.mu.Unlock()
	return rc, facts, nil
}

// CachedClient returns the cached answer of Client, if there is a fresh
// one; it never blocks.
func (p *pluginsAdapter) CachedClient(name string, typ claim.PluginType) (csi.Client, claim.Facts, bool) {
	p.mu.Lock()
	e, ok := p.cache[targetKey{name, typ}]
	p.mu.Unlock()
	if !ok || !p.now().Before(e.expires) {
		return nil, claim.Facts{}, false
	}
	return e.client, e.facts, true
}

// resolve asks the registry, bypassing the cache.
func (p *pluginsAdapter) resolve(ctx context.Context, k targetKey) (csi.Client, claim.Facts, error) {
	t, err := p.reg.Client(ctx, k.plugin, plugin.Role(k.typ))
	if err != nil {
		return nil, claim.Facts{}, err
	}
	facts := claim.Facts{ControllerRequired: t.ControllerRequired}
	fp := t.Fingerprint
	facts.ControllerService = fp.Capabilities.ControllerService
	facts.OnlineExpansion = fp.Capabilities.OnlineExpansion
	facts.OfflineExpansion = fp.Capabilities.OfflineExpansion
	facts.AccessibilityConstraints = fp.Capabilities.VolumeAccessibilityConstraints
	if fp.Controller != nil {
		facts.ControllerExpand = fp.Controller.ExpandVolume
		facts.ControllerModify = fp.Controller.ModifyVolume
		facts.CloneVolume = fp.Controller.CloneVolume
		facts.ControllerCondition = fp.Controller.GetVolume && fp.Controller.VolumeCondition
		facts.ControllerHealth = fp.Controller.GetVolumeHealth
		facts.CreateDeleteSnapshot = fp.Controller.CreateDeleteSnapshot
		facts.ListSnapshots = fp.Controller.ListSnapshots
	}
	if fp.NodeInfo == nil || fp.Node == nil {
		if nt, err := p.reg.Client(ctx, k.plugin, plugin.Node); err == nil {
			fp = nt.Fingerprint
		}
	}
	if fp.NodeInfo != nil {
		facts.NodeID = fp.NodeInfo.NodeID
		facts.Topology = fp.NodeInfo.AccessibleTopology
		facts.MaxVolumesPerNode = fp.NodeInfo.MaxVolumesPerNode
	}
	if fp.Node != nil {
		facts.StageUnstage = fp.Node.StageUnstageVolume
		facts.NodeExpand = fp.Node.ExpandVolume
		facts.VolumeStats = fp.Node.GetVolumeStats
		facts.NodeCondition = fp.Node.GetVolumeStats && fp.Node.VolumeCondition
		facts.NodeHealth = fp.Node.GetVolumeHealth
		facts.VolumeMountGroup = fp.Node.VolumeMountGroup
	}
	return t.Client, facts, nil
}

// refresh drops k's entry and returns the client that serves k now.
func (p *pluginsAdapter) refresh(ctx context.Context, k targetKey) (csi.Client, error) {
	p.invalidate()
	c, _, err := p.resolve(ctx, k)
	return c, err
}

// invalidate drops every cached entry, and makes answers the registry gave
// before it unfit for caching.
func (p *pluginsAdapter) invalidate() {
	p.mu.Lock()
	p.gen++
	clear(p.cache)
	p.mu.Unlock()
}

// Refingerprint asks the node allocations of plugin name to fingerprint
// now (claim.Refingerprinter); the registry's node_info_changed event then
// drops the cached facts.
func (p *pluginsAdapter) Refingerprint(name string) { p.reg.Refingerprint(name) }

// WaitHealthy blocks until the plugin has a healthy allocation for typ.
func (p *pluginsAdapter) WaitHealthy(ctx context.Context, name string, typ claim.PluginType) error {
	return p.reg.WaitHealthy(ctx, name, plugin.Role(typ))
}

// retryingClient is a cached client whose volume calls are sent once more,
// to the allocation that serves now, when they fail because the client was
// closed (see pluginsAdapter). Other calls go to the cached client as they
// are.
type retryingClient struct {
	csi.Client
	p   *pluginsAdapter
	key targetKey
}

// again runs call on c; when it fails with csi.ErrClosed, it runs it once
// more on the client that serves c's plugin and type now.
func again[T any](ctx context.Context, c *retryingClient, call func(csi.Client) (T, error)) (T, error) {
	v, err := call(c.Client)
	if err == nil || !errors.Is(err, csi.ErrClosed) {
		return v, err
	}
	fresh, rerr := c.p.refresh(ctx, c.key)
	if rerr != nil {
		var zero T
		// Unavailable: the steps retry it once a plugin is healthy again.
		return zero, fmt.Errorf("%w: %w", status.Error(codes.Unavailable, "plugin allocation closed and no other available"), rerr)
	}
	return call(fresh)
}

func (c *retryingClient) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.CreateVolumeResponse, error) { return cl.CreateVolume(ctx, req) })
}

func (c *retryingClient) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.DeleteVolume(ctx, req) })
	return err
}

func (c *retryingClient) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.ControllerPublishVolumeResponse, error) {
		return cl.ControllerPublishVolume(ctx, req)
	})
}

func (c *retryingClient) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.ControllerUnpublishVolume(ctx, req) })
	return err
}

func (c *retryingClient) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.NodeStageVolume(ctx, req) })
	return err
}

func (c *retryingClient) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.NodeUnstageVolume(ctx, req) })
	return err
}

func (c *retryingClient) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.NodePublishVolume(ctx, req) })
	return err
}

func (c *retryingClient) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.NodeUnpublishVolume(ctx, req) })
	return err
}

func (c *retryingClient) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.ControllerExpandVolumeResponse, error) {
		return cl.ControllerExpandVolume(ctx, req)
	})
}

func (c *retryingClient) ControllerModifyVolume(ctx context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.ControllerModifyVolumeResponse, error) {
		return cl.ControllerModifyVolume(ctx, req)
	})
}

func (c *retryingClient) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.NodeExpandVolumeResponse, error) { return cl.NodeExpandVolume(ctx, req) })
}

func (c *retryingClient) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.GetCapacityResponse, error) { return cl.GetCapacity(ctx, req) })
}

func (c *retryingClient) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.ListVolumesResponse, error) { return cl.ListVolumes(ctx, req) })
}

func (c *retryingClient) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.CreateSnapshotResponse, error) { return cl.CreateSnapshot(ctx, req) })
}

func (c *retryingClient) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) error {
	_, err := again(ctx, c, func(cl csi.Client) (struct{}, error) { return struct{}{}, cl.DeleteSnapshot(ctx, req) })
	return err
}

func (c *retryingClient) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	return again(ctx, c, func(cl csi.Client) (*csipb.ListSnapshotsResponse, error) { return cl.ListSnapshots(ctx, req) })
}

func (c *retryingClient) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (csi.VolumeStats, error) {
	return again(ctx, c, func(cl csi.Client) (csi.VolumeStats, error) { return cl.NodeGetVolumeStats(ctx, req) })
}

func (c *retryingClient) ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (csi.VolumeHealth, error) {
	return again(ctx, c, func(cl csi.Client) (csi.VolumeHealth, error) { return cl.ControllerGetVolume(ctx, req) })
}

func (c *retryingClient) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (csi.VolumeCondition, error) {
	return again(ctx, c, func(cl csi.Client) (csi.VolumeCondition, error) { return cl.NodeGetVolumeHealth(ctx, req) })
}

func (c *retryingClient) ControllerGetVolumeHealth(ctx context.Context, req *csipb.ControllerGetVolumeHealthRequest) (csi.VolumeCondition, error) {
	return again(ctx, c, func(cl csi.Client) (csi.VolumeCondition, error) { return cl.ControllerGetVolumeHealth(ctx, req) })
}
