package api

import (
	"context"

	"github.com/csiactor/csiactor/runtime"
)

// Backend is what the HTTP API serves: the runtime's public operations.
// Every method takes ctx first and returns the runtime's sentinel errors
// (runtime.ErrInvalid, ErrNotFound, ErrConflict, ErrPluginUnavailable,
// ErrShutdown), wrapped, which the handlers turn into status codes.
//
// The handlers validate IDs and bodies before calling a Backend, but a
// Backend must validate again: it is also called directly by embedders.
type Backend interface {
	// RegisterAllocation registers (or, with the same spec, re-registers)
	// the allocation id. It returns the allocation as now known.
	RegisterAllocation(ctx context.Context, id string, spec runtime.AllocationSpec) (runtime.Allocation, error)
	// DeregisterAllocation removes the allocation id (and stops its
	// process, if exec-managed).
	DeregisterAllocation(ctx context.Context, id string) error
	// Allocations lists every allocation, ordered by plugin, then type,
	// newest first.
	Allocations(ctx context.Context) ([]runtime.Allocation, error)
	// Plugins lists every plugin, by name.
	Plugins(ctx context.Context) ([]runtime.Plugin, error)
	// AllocationLogs calls fn with the output lines of the exec-managed
	// allocation id, oldest first, as q says (see
	// runtime.Runtime.AllocationLogs). It fails with ErrNotFound for an
	// unknown or attached allocation before fn is called.
	AllocationLogs(ctx context.Context, id string, q runtime.LogsQuery, fn func(runtime.LogLine) error) error
	// Plugin returns one plugin, or ErrNotFound.
	Plugin(ctx context.Context, name string) (runtime.Plugin, error)
	// PluginCapacity asks plugin name's controller how much it can
	// provision (see runtime.Runtime.PluginCapacity).
	PluginCapacity(ctx context.Context, name string, q runtime.CapacityQuery) (runtime.Capacity, error)
	// ListExternalVolumes lists one page of plugin name's own volumes (see
	// runtime.Runtime.ListExternalVolumes).
	ListExternalVolumes(ctx context.Context, name string, q runtime.ExternalVolumesQuery) (runtime.ExternalVolumes, error)
	// CallPlugin sends one raw CSI call to plugin name's allocation of
	// its type (see runtime.Runtime.CallPlugin); a plugin's error is in
	// the result, not the error.
	CallPlugin(ctx context.Context, name string, c runtime.PluginCall) (runtime.PluginCallResult, error)

	// RegisterVolume registers an existing volume of a plugin as id.
	// Registering the same id with the same spec again is a no-op.
	RegisterVolume(ctx context.Context, id string, spec runtime.VolumeSpec) (runtime.Volume, error)
	// CreateVolume creates a volume through the plugin's controller and
	// registers it.
	CreateVolume(ctx context.Context, spec runtime.CreateVolumeSpec) (runtime.Volume, error)
	// DeleteVolume deregisters the volume id, and with deleteToo also
	// deletes it through the controller. It fails with ErrConflict while
	// the volume has claims or past claims.
	DeleteVolume(ctx context.Context, id string, deleteToo bool) error
	// ExpandVolume grows the volume id to at least req.CapacityBytes (see
	// runtime.Runtime.ExpandVolume); it returns the volume when done.
	ExpandVolume(ctx context.Context, id string, req runtime.ExpandRequest) (runtime.Volume, error)
	// ModifyVolume changes the volume id's mutable parameters (see
	// runtime.Runtime.ModifyVolume); it returns the volume when done.
	ModifyVolume(ctx context.Context, id string, req runtime.ModifyRequest) (runtime.Volume, error)
	// Volumes lists the volumes that match filter, by ID.
	Volumes(ctx context.Context, filter runtime.VolumeFilter) ([]runtime.Volume, error)
	// VolumesPage lists one page of them (see
	// runtime.Runtime.VolumesPage): at most perPage from token on, and
	// the next page's token, empty on the last.
	VolumesPage(ctx context.Context, filter runtime.VolumeFilter, perPage int, token string) ([]runtime.Volume, string, error)
	// Volume returns one volume, or ErrNotFound.
	Volume(ctx context.Context, id string) (runtime.Volume, error)
	// Claim claims the volume volumeID for req.Alloc and publishes it; it
	// returns when the claim is published (or failed finally), with its
	// target path. The same request again returns the same claim.
	Claim(ctx context.Context, volumeID string, req runtime.ClaimRequest) (runtime.Claim, error)
	// Release releases alloc's claim on volumeID. It returns as soon as
	// the claim is recorded as a past claim, with its state; the teardown
	// goes on in the background.
	Release(ctx context.Context, volumeID, alloc string) (runtime.Claim, error)

	// Ready reports whether the agent has finished starting (restore and
	// the host check), and what is still pending.
	Ready(ctx context.Context) (runtime.Readiness, error)

	// Events returns the recent events, oldest first.
	Events(ctx context.Context) ([]runtime.Event, error)
	// Subscribe returns a channel that receives the recent events, oldest
	// first, then every later event, with no gap. The channel is closed
	// when ctx is done or the runtime shuts down. A subscriber that does
	// not keep up loses events (and gets an EventsDropped event) rather
	// than slowing the runtime.
	Subscribe(ctx context.Context) (<-chan runtime.Event, error)
}
