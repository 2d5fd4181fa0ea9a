package runtime

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/actors/snapshot"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

// kindError marks an error from an actor package with the runtime sentinel
// it means, keeping the original message and chain.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// mapErr marks err with the runtime sentinel the HTTP API maps to a status
// code. Errors that already carry one are returned as they are.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	for _, s := range []error{ErrInvalid, ErrNotFound, ErrConflict, ErrPluginUnavailable, ErrShutdown, ErrClusterUnavailable} {
		if errors.Is(err, s) {
			return err
		}
	}
	var kind error
	switch {
	// Before the context errors: an etcd request that timed out is the
	// cluster's unavailability, not the caller's deadline.
	case errors.Is(err, volume.ErrArbiterUnavailable), errors.Is(err, cluster.ErrUnavailable), errors.Is(err, cluster.ErrClosed):
		kind = ErrClusterUnavailable
	case errors.Is(err, cluster.ErrConflict), errors.Is(err, cluster.ErrInUse):
		kind = ErrConflict
	case errors.Is(err, cluster.ErrInvalidConfig):
		kind = ErrInvalid
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, volume.ErrInvalid), errors.Is(err, plugin.ErrInvalidSpec),
		errors.Is(err, csi.ErrInvalidCapability), errors.Is(err, csi.ErrInvalidEndpoint):
		kind = ErrInvalid
	case errors.Is(err, volume.ErrPluginUnavailable), errors.Is(err, registry.ErrNoHealthyPlugin):
		// Before ErrNotFound: a volume whose plugin is not registered (yet,
		// or any more) exists; its plugin is what is missing.
		kind = ErrPluginUnavailable
	case errors.Is(err, volume.ErrNotFound), errors.Is(err, snapshot.ErrNotFound), errors.Is(err, registry.ErrAllocationNotFound),
		errors.Is(err, registry.ErrPluginNotFound):
		kind = ErrNotFound
	case errors.Is(err, volume.ErrConflict), errors.Is(err, registry.ErrConflict), errors.Is(err, registry.ErrBusy):
		kind = ErrConflict
	case errors.Is(err, volume.ErrShutdown), errors.Is(err, snapshot.ErrShutdown), errors.Is(err, registry.ErrStopped):
		kind = ErrShutdown
	default:
		if kind = pluginCodeKind(csi.Code(err)); kind == nil {
			return err
		}
	}
	return &kindError{kind: kind, err: err}
}

// pluginCodeKind is what a plugin's final answer means for the API caller:
// the plugin refused the request itself (its volume does not exist, an
// argument is bad, the state forbids it) or could not serve it now. Other
// codes (Internal, Unimplemented, PermissionDenied, ...) stay server errors.
func pluginCodeKind(c codes.Code) error {
	switch c {
	case codes.NotFound:
		return ErrNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		return ErrInvalid
	case codes.AlreadyExists, codes.FailedPrecondition:
		return ErrConflict
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return ErrPluginUnavailable
	}
	return nil
}

func allocationFromInfo(i registry.AllocationInfo) Allocation {
	return Allocation{
		ID: i.ID, Plugin: i.Plugin, Type: string(i.Type), Socket: i.Socket,
		Command: i.Command, Healthy: i.Healthy, HealthDescription: i.HealthDescription,
		Singleton: i.Singleton, NodeID: i.NodeID, Source: string(i.Source), PID: i.PID,
		Capabilities: i.Capabilities,
		Image:        i.Image, Engine: i.Engine, ImageDigest: i.ImageDigest, ContainerID: i.ContainerID,
	}
}

func pluginFromSummary(s registry.PluginSummary) Plugin {
	p := Plugin{
		Name: s.Name, Provider: s.Provider, Version: s.Version,
		ControllerRequired:  s.ControllerRequired,
		ControllersHealthy:  s.ControllersHealthy,
		ControllersExpected: s.ControllersExpected,
		NodesHealthy:        s.NodesHealthy,
		NodesExpected:       s.NodesExpected,
		Allocations:         make([]Allocation, 0, len(s.Allocations)),
	}
	for _, a := range s.Allocations {
		p.Allocations = append(p.Allocations, allocationFromInfo(a))
	}
	return p
}

// volumeSpec converts a validated API spec to the volume manager's.
func volumeSpec(id string, s VolumeSpec) (volume.Spec, error) {
	vs := volume.Spec{
		ID: id, Plugin: s.Plugin, ExternalID: s.ExternalID,
		MountOptions: s.MountOptions.CSI(),
		Parameters:   s.Parameters, Context: s.Context, Secrets: s.Secrets,
		SecretsFrom: s.secretsRef(),
	}
	for i, c := range s.Capabilities {
		vc, err := c.Parse()
		if err != nil {
			return volume.Spec{}, prefixed(capField(i), err)
		}
		vs.Capabilities = append(vs.Capabilities, vc)
	}
	return vs, nil
}

func capField(i int) string { return "capabilities[" + strconv.Itoa(i) + "]" }

// volumeFromManager is the public shape of the manager's volume: the
// fields the API shows, the claims without their host (withHosts sets it).
func volumeFromManager(v volume.Volume) Volume {
	out := Volume{
		ID: v.ID, Plugin: v.Plugin, ExternalID: v.ExternalID, MountOptions: v.MountOptions,
		Parameters: v.Parameters, Context: v.Context, CapacityBytes: v.CapacityBytes,
		Created: v.Created, CreatedAt: v.CreatedAt,
		Claims: make([]Claim, 0, len(v.Claims)), PastClaims: make([]Claim, 0, len(v.PastClaims)),
		Expansion: v.Expansion, AccessibleTopology: v.AccessibleTopology,
		Usage: v.Usage, Condition: v.Condition, UsageStatus: v.UsageStatus, ConditionStatus: v.ConditionStatus,
		Ephemeral: v.Ephemeral, EphemeralPhase: v.EphemeralPhase,
		MutableParameters: v.MutableParameters, Modifying: v.Modifying,
	}
	if v.SecretsFrom != "" {
		out.SecretsFrom = &SecretsFrom{File: v.SecretsFrom}
	}
	for _, c := range v.Capabilities {
		out.Capabilities = append(out.Capabilities, Capability(c))
	}
	for _, c := range v.Claims {
		out.Claims = append(out.Claims, claimFromManager(c))
	}
	for _, c := range v.PastClaims {
		out.PastClaims = append(out.PastClaims, claimFromManager(c))
	}
	return out
}

// claimFromManager is the public shape of the manager's claim.
func claimFromManager(c volume.Claim) Claim {
	out := Claim{
		Alloc: c.Alloc, Mode: c.Mode, AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode,
		State: c.State, TargetPath: c.TargetPath, LastError: c.LastError,
		Repair: c.Repair, Condition: c.Condition,
	}
	setClaimOptions(&out, c)
	return out
}

// The store must satisfy what the actor packages ask of it.
var (
	_ registry.Store = (*persistence.Store)(nil)
	_ volume.Store   = (*persistence.Store)(nil)
)
