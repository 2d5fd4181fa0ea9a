package registry

import "github.com/csiactor/csiactor/actors/plugin"

// Register is sent to the registry to register an allocation; it responds
// with *RegisterResult. Registration is idempotent (see the package doc).
type Register struct {
	Spec plugin.Spec
	// Source is where the allocation comes from; empty means SourceAPI.
	// SourceConfig is not accepted here (Config.ConfigAllocations is the
	// config file's way in). A SourceRegistration request for an ID that
	// another source registered is ErrConflict.
	Source Source
}

// RegisterResult answers Register. Created is false when the allocation
// was already registered with the same spec.
type RegisterResult struct {
	Alloc   AllocationInfo
	Created bool
	Err     error
}

// Deregister is sent to the registry to deregister an allocation; it
// responds with *DeregisterResult once the allocation's actor has stopped.
type Deregister struct {
	ID string
}

// DeregisterResult answers Deregister.
type DeregisterResult struct {
	Err error
}

// ListAllocations is sent to the registry to list every allocation; it
// responds with *AllocationsResult.
type ListAllocations struct{}

// AllocationsResult answers ListAllocations: allocations sorted by plugin,
// then newest first.
type AllocationsResult struct {
	Allocs []AllocationInfo
}

// GetPlugins is sent to the registry to summarize plugins; it responds
// with *PluginsResult. With Name set, only that plugin (Err wraps
// ErrPluginNotFound when it has no allocation).
type GetPlugins struct {
	Name string
}

// PluginsResult answers GetPlugins, sorted by name.
type PluginsResult struct {
	Plugins []PluginSummary
	Err     error
}

// GetClient is sent to the registry by whoever needs to call a plugin in a
// role (the volume and claim actors); it responds with *ClientResult.
type GetClient struct {
	Plugin string
	Role   plugin.Role
}

// Refingerprint is sent to the registry by whoever learnt that what a
// plugin announced may have changed (the runtime, after a
// ControllerPublishVolume answered ResourceExhausted): every running
// allocation of Plugin that serves the node fingerprints at once. There is
// no answer; a changed max_volumes_per_node or topology is announced with
// EventNodeInfoChanged.
type Refingerprint struct {
	Plugin string
}

// ClientResult answers GetClient. Err wraps ErrPluginNotFound or
// ErrNoHealthyPlugin.
type ClientResult struct {
	Target Target
	Err    error
}

// shutdownAll is sent to the registry by Handle.Shutdown: every allocation
// actor is stopped; the registry responds with *shutdownDone once each has
// sent its final state and that state is persisted.
type shutdownAll struct{}

// shutdownDone answers shutdownAll.
type shutdownDone struct{}
