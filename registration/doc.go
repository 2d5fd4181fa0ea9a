// Package registration registers the CSI drivers announced in a kubelet
// plugin registration directory, as the kubelet's plugin watcher does, so
// that a driver deployed with node-driver-registrar works with the agent
// unchanged.
//
// # Basics
//
// A registrar (node-driver-registrar, beside each node plugin) serves the
// kubelet's plugin registration API v1 on a unix socket that it creates in
// the registration directory (the kubelet's is
// /var/lib/kubelet/plugins_registry). [Start] watches that directory and
// its subdirectories with inotify; for each registration socket, the
// sockets already there at start included, it calls GetInfo and checks
// the answer: type CSIPlugin, a name, a CSI 1.x version among the
// supported versions, and the endpoint (the driver's CSI socket; empty
// means the registration socket itself). A driver that passes is handed to
// the [Registrar] (the agent makes it an attached node allocation of
// plugin Name on that endpoint), and the registrar is told
// NotifyRegistrationStatus(registered=true). A driver that does not pass,
// or that the Registrar refuses ([ErrRefused]), is told
// registered=false with the reason, and is not tried again until its
// socket is created anew (node-driver-registrar exits on a refusal and
// creates it again when restarted).
//
// A socket that does not answer GetInfo (nothing listens yet, or the
// registrar hangs) is tried again with backoff; so is a registration the
// Registrar failed for another reason. When the registration socket is
// removed, the driver is deregistered, unless another socket of the
// directory registered the same driver: that one registers it again.
//
// Start-up. The sockets present when Start runs are registered like new
// ones; registering a driver that is registered already changes nothing,
// so an agent restarted with the sockets still there keeps its allocations.
// Once each of those sockets has answered GetInfo (or is known to have
// nothing listening, or is gone), the drivers an earlier run registered
// that no socket announces any more are deregistered.
//
// When inotify loses events (its queue overflowed), the directory is
// scanned again and the registrations follow what is there. Names that
// start with '.' are skipped, as the kubelet skips them.
//
// The wire format is the kubelet's (package pluginregistration, service
// Registration, the same field numbers): [Client] is the agent's side,
// [RegisterServer] the registrar's, for tests and Go programs that
// register a driver.
//
// # Caveats
//
// Sockets are handled one at a time by one goroutine: a registrar that
// accepts connections but never answers holds the others up for
// Config.CallTimeout per attempt. The driver is registered as a node
// allocation only: a plugin whose claims need ControllerPublishVolume
// needs its controller registered as well (through the API or the config
// file), as in Kubernetes, where the controller runs elsewhere.
package registration
