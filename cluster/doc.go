// Package cluster lets many csiactor agents share volumes and claims
// through etcd. It is the only package that imports the etcd client, as
// persistence is the only one that imports bbolt.
//
// # Basics
//
// [Open] dials etcd, grants this host a lease and keeps a liveness key on
// it. A [Session] then holds, under its key prefix (DefaultPrefix):
//
//	<prefix>/hosts/<node>     the host: when it was last seen (no lease)
//	<prefix>/alive/<node>     the host's liveness key, on its lease
//	<prefix>/volumes/<id>     a volume's definition, shared by every host
//	<prefix>/claims/<id>      a volume's claims on every host (no lease)
//	<prefix>/fenced/<node>/<id>/<alloc>  a claim taken from a down host
//	<prefix>/plugins/<plugin>  what a controller of the plugin says (no lease)
//	<prefix>/leaders/<plugin>/<lease>  the plugin's controller election
//	<prefix>/controller/<plugin>/<id>/<csi-node>  a controller request
//
// (plugin names and CSI node IDs in keys are URL path-escaped.)
//
// A claim is admitted by [Session.Admit] in one etcd transaction that
// compares the claims key's mod revision (compare-and-swap) and this
// host's liveness key's lease, after the caller's check (the access-mode
// table, applied to the claims of every host) passed on what was read.
// Claims are never attached to a lease: a dead agent's claims stay until
// they are released. [Session.Free] removes a freed claim, retrying in the
// background until etcd has it.
//
// A down host's claims stay, blocking other writers, until it is fenced:
// [Session.HostClaims] lists them (only for a host whose liveness key is
// gone), the caller unpublishes them through a controller, and
// [Session.Fence] removes them and records them as fenced, in a
// transaction that requires the host to be down still. The host, when it
// is back, finds them with [Session.Fenced] and releases them locally.
//
// A host without a healthy controller of a plugin has the plugin's
// controller steps run elsewhere: [Session.RequestController] writes the
// ControllerPublishVolume or ControllerUnpublishVolume of a volume for its
// CSI node ID as a [ControllerRequest] and waits for the answer; so it
// does with the plugin's other controller operations (CreateVolume,
// DeleteVolume, ControllerExpandVolume, ControllerModifyVolume,
// ValidateVolumeCapabilities, CreateSnapshot, DeleteSnapshot), keyed by operation, CSI name or ID and
// host, and removed once their answer is read. Every
// host with a healthy controller of the plugin runs
// [Session.ServeController], which campaigns in the plugin's election
// (a key on a go.etcd.io/etcd/client/v3/concurrency session's lease; the
// oldest key leads); the leader runs each pending
// request through its [ControllerHandler] and writes back the answer, in
// a transaction that requires it to lead still. A new leader runs every
// request still pending. The hosts with a controller record what it says
// ([Session.PutControllerInfo]) for the hosts without one.
//
// Each host's own steps (stagings, usage counts, publish context,
// allocations) stay in its bbolt store. docs/operations.md ("Cluster
// mode") covers setting up etcd and fencing.
//
// # Caveats
//
// A lease is not mutual exclusion: an agent cut off from etcd does not
// learn that its lease expired. A Session therefore stops admitting new
// claims on its own timer, counted from the send time of the last
// keepalive etcd acknowledged, a quarter of the TTL before the lease can
// expire on the server ([Session.AdmitDeadline]). Published claims keep
// working through an etcd outage; new claims fail with [ErrUnavailable].
package cluster
