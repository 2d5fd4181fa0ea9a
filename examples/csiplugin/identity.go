package csiplugin

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identityServer is the CSI Identity service.
type identityServer struct {
	csipb.UnimplementedIdentityServer
	p *Plugin
}

func (s *identityServer) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{
		Name:          s.p.cfg.Name,
		VendorVersion: s.p.cfg.Version,
		Manifest:      map[string]string{"mount_mode": string(s.p.cfg.MountMode)},
	}, nil
}

func (s *identityServer) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	resp := &csipb.GetPluginCapabilitiesResponse{
		Capabilities: []*csipb.PluginCapability{{
			Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{
				Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE,
			}},
		}, {
			Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{
				Type: csipb.PluginCapability_VolumeExpansion_ONLINE,
			}},
		}},
	}
	if s.p.cfg.Zone != "" {
		resp.Capabilities = append(resp.Capabilities, &csipb.PluginCapability{
			Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{
				Type: csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
			}},
		})
	}
	return resp, nil
}

// Probe reports ready: the state is loaded before the server starts, so a
// plugin that answers is ready.
func (s *identityServer) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
