package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// FencedClaim is a claim a fence took from a down host.
type FencedClaim struct {
	Volume string `json:"volume"`
	Alloc  string `json:"alloc"`
	Mode   string `json:"mode"`
	// ControllerUnpublished says ControllerUnpublishVolume ran (on this
	// agent's controller or the plugin's controller leader) for the
	// fenced host's node ID. It is false for a claim that never went
	// through ControllerPublishVolume: then only the claim was taken.
	ControllerUnpublished bool `json:"controller_unpublished"`
}

// FenceResult is what FenceNode did.
type FenceResult struct {
	Node   string        `json:"node"`
	Claims []FencedClaim `json:"claims"`
}

// FenceNode fences the down host id, so that other hosts can claim its
// volumes: for each of its claims that went through
// ControllerPublishVolume, a controller of the volume's plugin unpublishes
// the volume from the host's node ID (this agent's, or, when it has no
// healthy one or while the leader has a publish of the host's for the
// volume, pending or done, the plugin's controller leader in the
// cluster); then the
// claims are removed from etcd and recorded as fenced, in a transaction
// that requires the host to be down still. The host, when it is back,
// releases them locally (unpublish and unstage).
//
// It fails with ErrNotFound outside cluster mode or for a host that never
// joined, ErrConflict for this agent's own host or a host that is up,
// ErrPluginUnavailable when no host of the cluster has a healthy
// controller for a claim that needs one, and ErrClusterUnavailable when
// etcd does not answer. A volume whose unpublish failed keeps the host's
// claims; the others are fenced.
func (r *Runtime) FenceNode(ctx context.Context, id string) (FenceResult, error) {
	if err := ValidateID("id", id); err != nil {
		return FenceResult{}, err
	}
	if err := r.ready(); err != nil {
		return FenceResult{}, err
	}
	if r.cluster == nil {
		return FenceResult{}, kinderr.Errorf(ErrNotFound, "not in cluster mode (the agent has no cluster section)")
	}
	if id == r.cluster.NodeID() {
		return FenceResult{}, kinderr.Errorf(ErrConflict, "%q is this agent's own host", id)
	}
	return r.fenceHost(ctx, id, "")
}

// fenceHost fences the claims of the down host id on the volumes of
// plugin, or of every plugin when plugin is empty.
func (r *Runtime) fenceHost(ctx context.Context, id, plugin string) (FenceResult, error) {
	held, err := r.cluster.HostClaims(ctx, id)
	switch {
	case errors.Is(err, cluster.ErrUnknownHost):
		return FenceResult{}, fmt.Errorf("%w: node %q: %w", ErrNotFound, id, err)
	case errors.Is(err, cluster.ErrHostUp):
		return FenceResult{}, fmt.Errorf("%w: %w", ErrConflict, err)
	case err != nil:
		return FenceResult{}, mapErr(err)
	}
	log := r.log.WithFields(logrus.Fields{"component": "cluster", "node": id})
	out := FenceResult{Node: id, Claims: []FencedClaim{}}
	var errs []error
	for _, vol := range slices.Sorted(maps.Keys(held)) {
		fenced, err := r.fenceVolume(ctx, id, vol, plugin, held[vol])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.Claims = append(out.Claims, fenced...)
		for _, c := range fenced {
			log.WithFields(logrus.Fields{"volume": vol, "alloc": c.Alloc, "controller_unpublished": c.ControllerUnpublished}).
				Warn("claim of a down host fenced")
		}
	}
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	return out, nil
}

// fenceVolume unpublishes vol from host's node ID where its claims need
// it, then fences them in etcd. With plugin set, a volume of another
// plugin is left alone.
func (r *Runtime) fenceVolume(ctx context.Context, host, vol, plugin string, cs []cluster.HostClaim) ([]FencedClaim, error) {
	def, err := r.cluster.VolumeDef(ctx, vol)
	if err != nil {
		return nil, mapErr(err)
	}
	var cv clusterVolume
	if def != nil {
		if cv, _, err = decodeClusterVolume(vol, def, r.keys); err != nil {
			return nil, err
		}
	}
	if plugin != "" && cv.Spec.Plugin != plugin {
		return nil, nil
	}
	var out []FencedClaim
	unpublished := map[string]bool{} // CSI node IDs done
	for _, c := range cs {
		fc := FencedClaim{Volume: vol, Alloc: c.Alloc, Mode: c.Mode}
		if c.ControllerRequired {
			if def == nil {
				return nil, fmt.Errorf("fence %q on volume %q: %w: volume %q has no definition in the cluster", host, vol, ErrNotFound, vol)
			}
			if !unpublished[c.CSINodeID] {
				if err := r.controllerUnpublish(ctx, vol, cv, c.CSINodeID); err != nil {
					return nil, fmt.Errorf("fence %q on volume %q: %w", host, vol, err)
				}
				unpublished[c.CSINodeID] = true
			}
			fc.ControllerUnpublished = true
		}
		out = append(out, fc)
	}
	allocs := make([]string, 0, len(cs))
	for _, c := range cs {
		allocs = append(allocs, c.Alloc)
	}
	if err := r.cluster.Fence(ctx, host, vol, allocs); err != nil {
		if errors.Is(err, cluster.ErrHostUp) {
			return nil, fmt.Errorf("%w: %w", ErrConflict, err)
		}
		return nil, mapErr(err)
	}
	return out, nil
}

// controllerUnpublish runs ControllerUnpublishVolume of vol (as the
// cluster defines it, with its secrets) for nodeID on this agent's
// controller of the volume's plugin, or, without a healthy one here or
// while the fenced host has a controller request for the volume pending
// with the leader or the leader published it for the host (the unpublish
// must come after, where the publish ran), on the plugin's controller
// leader in the cluster. NotFound counts as done.
func (r *Runtime) controllerUnpublish(ctx context.Context, vol string, cv clusterVolume, nodeID string) error {
	req := &csipb.ControllerUnpublishVolumeRequest{VolumeId: cv.Spec.ExternalID, NodeId: nodeID, Secrets: cv.Spec.Secrets}
	requested, err := r.cluster.HasControllerRequest(ctx, cv.Spec.Plugin, vol, nodeID)
	if err != nil {
		return mapErr(err)
	}
	c, _, lerr := r.plugins.Client(ctx, cv.Spec.Plugin, claim.ControllerPlugin)
	if lerr == nil && !requested {
		err = c.ControllerUnpublishVolume(ctx, req)
	} else {
		rc := &remoteController{p: r.ctrl, plugin: cv.Spec.Plugin, volume: vol}
		err = rc.ControllerUnpublishVolume(ctx, req)
		switch {
		case errors.Is(err, cluster.ErrNoController) && lerr != nil:
			return fmt.Errorf("%w: no healthy controller of plugin %q on this host or any host of the cluster to unpublish volume %q from the fenced host: %w",
				ErrPluginUnavailable, cv.Spec.Plugin, vol, err)
		case errors.Is(err, cluster.ErrNoController):
			return fmt.Errorf("%w: the fenced host's controller request of volume %q waits in the cluster, and no host leads the controller of plugin %q to unpublish it after that request: %w",
				ErrPluginUnavailable, vol, cv.Spec.Plugin, err)
		}
	}
	if csi.Classify(csi.UnpublishKind, err) == csi.Success {
		return nil
	}
	return mapErr(fmt.Errorf("ControllerUnpublishVolume of volume %q from node %q: %w", vol, nodeID, err))
}

// releaseFenced releases here the claims other hosts fenced while this
// host was down (the teardown unpublishes and unstages them), and clears
// their fence records. It returns the released claims' volume/alloc.
func (r *Runtime) releaseFenced(ctx context.Context) (map[[2]string]bool, error) {
	fenced, err := r.cluster.Fenced(ctx)
	if err != nil {
		return nil, err
	}
	done := map[[2]string]bool{}
	for _, f := range fenced {
		log := r.log.WithFields(logrus.Fields{"component": "cluster", "volume": f.Volume, "alloc": f.Alloc})
		_, err := r.volumes.Release(ctx, f.Volume, f.Alloc)
		if err != nil && !errors.Is(err, volume.ErrNotFound) {
			log.WithError(err).Warn("cannot release a claim another host fenced")
			continue
		}
		log.Warn("another host fenced this claim while this host was away; released it here")
		done[[2]string{f.Volume, f.Alloc}] = true
		if err := r.cluster.ClearFenced(ctx, f.Volume, f.Alloc); err != nil {
			return done, err
		}
	}
	return done, nil
}

// followRejoins releases fenced claims each time the session had to take
// a new lease (its old one expired: it may have been fenced meanwhile).
func (r *Runtime) followRejoins(ctx context.Context) {
	defer r.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cluster.Rejoined():
			if _, err := r.releaseFenced(ctx); err != nil && ctx.Err() == nil {
				r.log.WithError(err).Warn("cannot check for fenced claims after rejoining the cluster")
			}
		}
	}
}
