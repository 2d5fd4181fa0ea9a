package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/csi"
)

// fingerprint asks the plugin who it is and what it can do: Probe (with
// the client's probe timeout), GetPluginInfo, GetPluginCapabilities, then
// the controller and/or node capabilities and NodeGetInfo by type. It
// stops at the first failure; a plugin that answers ready=false fails with
// ErrNotReady. It never retries: the heartbeat is the retry.
func fingerprint(ctx context.Context, c csi.Client, typ Type) (Fingerprint, error) {
	var fp Fingerprint
	ready, err := c.Probe(ctx)
	if err != nil {
		return fp, err
	}
	if !ready {
		return fp, fmt.Errorf("probe: %w: it is starting", ErrNotReady)
	}
	info, err := c.PluginInfo(ctx)
	if err != nil {
		return fp, err
	}
	fp.Provider, fp.Version = info.Name, info.VendorVersion
	if fp.Capabilities, err = c.PluginCapabilities(ctx); err != nil {
		return fp, err
	}
	fp.RequiresController = fp.Capabilities.ControllerService
	if typ.Serves(Controller) {
		cc, err := c.ControllerCapabilities(ctx)
		if err != nil {
			return fp, err
		}
		fp.Controller = &cc
		fp.ControllerRequired = fp.RequiresController && cc.PublishUnpublishVolume
	}
	if typ.Serves(Node) {
		nc, err := c.NodeCapabilities(ctx)
		if err != nil {
			return fp, err
		}
		fp.Node = &nc
		ni, err := c.NodeInfo(ctx)
		if err != nil {
			return fp, err
		}
		fp.NodeInfo = &ni
	}
	fp.At = time.Now()
	return fp, nil
}
