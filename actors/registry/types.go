package registry

import (
	"maps"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/csi"
)

// Source says where an allocation was registered from.
type Source string

// The sources.
const (
	// SourceConfig: the agent's config file (Config.ConfigAllocations),
	// which is authoritative for it: on start its spec is the config's,
	// and it is deregistered when the config no longer lists it.
	SourceConfig Source = "config"
	// SourceAPI: Register (the API, the CLI, an embedder). Allocations
	// persisted before sources were recorded count as API ones.
	SourceAPI Source = "api"
	// SourceRegistration: a CSI driver registered in the watched
	// registration directory (RegisterFrom). Like an API allocation it
	// survives any config; the directory's watcher deregisters it when its
	// registration socket goes.
	SourceRegistration Source = "registration"
)

// sourceOf reads a persisted source; an empty one is SourceAPI.
func sourceOf(s string) Source {
	switch Source(s) {
	case SourceConfig, SourceRegistration:
		return Source(s)
	}
	return SourceAPI
}

// AllocationInfo is what the registry tells about one allocation. The
// JSON form is the API's.
type AllocationInfo struct {
	ID     string      `json:"id"`
	Plugin string      `json:"plugin"`
	Type   plugin.Type `json:"type"`
	Socket string      `json:"socket"`
	// Command is set for an exec-managed allocation. Its environment is
	// never shown.
	Command []string `json:"command,omitempty"`
	// Image, Engine, ImageDigest and ContainerID are set for a
	// container-managed allocation (ImageDigest and ContainerID while its
	// container runs).
	Image       string `json:"image,omitempty"`
	Engine      string `json:"engine,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	// Seq is the persisted creation sequence: higher is newer.
	Seq uint64 `json:"seq"`
	// Source is where the allocation was registered from.
	Source            Source    `json:"source"`
	Healthy           bool      `json:"healthy"`
	HealthDescription string    `json:"health_description"`
	HealthSince       time.Time `json:"health_since,omitzero"`
	// Singleton: the newest allocation of its plugin in at least one of
	// its roles. SingletonFor lists those roles.
	Singleton    bool          `json:"singleton"`
	SingletonFor []plugin.Role `json:"singleton_for,omitempty"`
	// ActiveFor lists the roles operations go to this allocation for.
	ActiveFor          []plugin.Role `json:"active_for,omitempty"`
	Provider           string        `json:"provider,omitempty"`
	Version            string        `json:"version,omitempty"`
	NodeID             string        `json:"node_id,omitempty"`
	ControllerRequired bool          `json:"controller_required,omitempty"`
	PID                int           `json:"pid,omitempty"`
	Exits              int           `json:"exits,omitempty"`
	// Capabilities is what the allocation's last fingerprint announced;
	// nil until it was fingerprinted since the agent started.
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}

// Capabilities is what an allocation's plugin can do, by CSI names: its
// plugin capabilities, its controller's and its node's RPC capabilities
// (by its type), and the node's topology and volume limit.
type Capabilities struct {
	Plugin     []string `json:"plugin"`
	Controller []string `json:"controller,omitempty"`
	Node       []string `json:"node,omitempty"`
	// Topology is NodeGetInfo's accessible topology segments.
	Topology map[string]string `json:"topology,omitempty"`
	// MaxVolumesPerNode is NodeGetInfo's limit; 0 means none.
	MaxVolumesPerNode int64 `json:"max_volumes_per_node,omitempty"`
}

// capabilitiesOf describes what fp announced; nil when fp was never taken.
func capabilitiesOf(fp plugin.Fingerprint) *Capabilities {
	if fp.At.IsZero() {
		return nil
	}
	c := &Capabilities{Plugin: fp.Capabilities.Names()}
	if fp.Controller != nil {
		c.Controller = fp.Controller.Names()
	}
	if fp.Node != nil {
		c.Node = fp.Node.Names()
	}
	if fp.NodeInfo != nil {
		c.Topology = maps.Clone(fp.NodeInfo.AccessibleTopology)
		c.MaxVolumesPerNode = fp.NodeInfo.MaxVolumesPerNode
	}
	return c
}

// PluginSummary is one plugin: its allocations and what they add up to.
type PluginSummary struct {
	Name string `json:"name"`
	// Provider and Version come from the newest allocation that was
	// fingerprinted.
	Provider string `json:"provider"`
	Version  string `json:"version"`
	// ControllerRequired: some allocation says the plugin needs a
	// controller, and a controller says it supports
	// PUBLISH_UNPUBLISH_VOLUME.
	ControllerRequired  bool `json:"controller_required"`
	ControllersHealthy  int  `json:"controllers_healthy"`
	ControllersExpected int  `json:"controllers_expected"`
	NodesHealthy        int  `json:"nodes_healthy"`
	NodesExpected       int  `json:"nodes_expected"`
	// Allocations, newest first.
	Allocations []AllocationInfo `json:"allocations"`
}

// Target is where an operation on a plugin in a role goes: the active
// allocation's client and what its fingerprint says.
type Target struct {
	// Alloc is the active allocation's ID.
	Alloc string
	// Client is the allocation's connection. It is owned by the allocation
	// actor: never close it. After the allocation stops, calls fail with
	// csi.ErrClosed; ask Client again.
	Client csi.Client
	// Fingerprint is the allocation's last fingerprint.
	Fingerprint plugin.Fingerprint
	// Singleton is false while operations go to an older allocation
	// because the singleton is unhealthy.
	Singleton bool
	// ControllerRequired is the plugin-level value (see PluginSummary).
	ControllerRequired bool
}

// EventType says what an Event is about.
type EventType string

// The event types.
const (
	// EventRegistered: an allocation was registered (or restored).
	EventRegistered EventType = "registered"
	// EventDeregistered: an allocation was deregistered.
	EventDeregistered EventType = "deregistered"
	// EventHealthChanged: an allocation's health or its description
	// changed.
	EventHealthChanged EventType = "health_changed"
	// EventSingletonChanged: the newest allocation of a plugin and role
	// changed (Alloc is the new one, empty when none is left).
	EventSingletonChanged EventType = "singleton_changed"
	// EventActiveChanged: operations of a plugin and role now go to
	// another allocation (Alloc; empty when none is healthy).
	EventActiveChanged EventType = "active_changed"
	// EventNodeInfoChanged: a fingerprint of an allocation changed what
	// NodeGetInfo says (max_volumes_per_node, topology, node ID) without
	// changing its health.
	EventNodeInfoChanged EventType = "node_info_changed"
	// EventPluginHung: an allocation answered its fingerprint while its
	// node RPCs kept timing out (plugin.Config.HungRPCRestart in a row):
	// an exec-managed allocation's process is being restarted, an
	// attached one is reported unhealthy. Message says how many.
	EventPluginHung EventType = "plugin_hung"
	// EventLagged: the subscriber was too slow and lost Dropped events,
	// the oldest it had not received; re-read the state to resync.
	EventLagged EventType = "lagged"
)

// Event is one registry event.
type Event struct {
	Time   time.Time `json:"time"`
	Type   EventType `json:"type"`
	Plugin string    `json:"plugin,omitempty"`
	// Role is set for singleton_changed and active_changed.
	Role    plugin.Role `json:"role,omitempty"`
	Alloc   string      `json:"alloc,omitempty"`
	Healthy bool        `json:"healthy"`
	Message string      `json:"message,omitempty"`
	// Dropped is set for lagged events.
	Dropped uint64 `json:"dropped,omitempty"`
}
