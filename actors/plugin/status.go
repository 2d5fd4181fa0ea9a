package plugin

import (
	"time"

	"github.com/csiactor/csiactor/csi"
)

// Fingerprint is what the last successful fingerprint of an allocation
// learned from the plugin.
type Fingerprint struct {
	// Provider and Version come from GetPluginInfo (name and
	// vendor_version).
	Provider string
	Version  string
	// Capabilities is the answer to GetPluginCapabilities.
	Capabilities csi.PluginCapabilities
	// Controller is set for controller and monolith allocations.
	Controller *csi.ControllerCapabilities
	// Node and NodeInfo are set for node and monolith allocations.
	Node     *csi.NodeCapabilities
	NodeInfo *csi.NodeInfo
	// RequiresController: the plugin says volumes need its controller
	// service (CONTROLLER_SERVICE).
	RequiresController bool
	// ControllerRequired: the plugin requires a controller and the
	// controller supports PUBLISH_UNPUBLISH_VOLUME, so every volume must
	// be controller-published before it is staged. It is only known from
	// a controller or monolith allocation; a node allocation leaves it
	// false and the registry decides it from the plugin's controllers.
	ControllerRequired bool
	// At is when the fingerprint was taken; zero if never.
	At time.Time
}

// Status is the state of an allocation as its actor sees it. It is sent
// to the parent in StatusChanged and Stopped, and answered to GetStatus.
type Status struct {
	// Healthy is true when the last fingerprint succeeded and the plugin
	// is ready.
	Healthy bool
	// Description says why: "healthy", or what failed ("plugin process
	// exited with signal: killed; restarting in 210ms", "failed to start:
	// fork/exec /x: no such file or directory; retrying in 200ms", "probe:
	// …", "agent shutting down").
	Description string
	// Since is when Healthy last changed.
	Since time.Time
	// Fingerprint is the last successful fingerprint; it is kept while the
	// allocation is unhealthy.
	Fingerprint Fingerprint
	// Client is the allocation's connection to the plugin, or nil while it
	// is not connected (and after the actor stopped). It is safe for
	// concurrent use; calls fail with csi.ErrClosed once the actor closed it.
	Client csi.Client
	// PID and PIDStart identify the running process of an exec-managed
	// allocation (PIDStart in clock ticks from /proc/<pid>/stat); zero
	// when none runs.
	PID      int
	PIDStart uint64
	// ContainerID and ImageDigest identify the running container of a
	// container-managed allocation and the image it runs (the engine's
	// image ID); empty when none runs.
	ContainerID string
	ImageDigest string
	// Exits counts the process exits seen by this actor.
	Exits int
	// Hung counts the times this actor found the plugin's node RPCs hung
	// (Config.HungRPCRestart): each time it restarted an exec-managed
	// process, or reported an attached allocation unhealthy.
	Hung int
}
