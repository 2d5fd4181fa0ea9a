// Package csi is csiactor's one door to a CSI plugin.
//
// # Basics
//
// [Dial] checks the endpoint ([ParseEndpoint]: unix:// or an absolute path,
// at most 107 bytes), waits under its context for the socket to appear and
// the connection to become READY, and returns a [Client] that owns one gRPC
// connection. Every RPC carries its own timeout on top of the caller's
// context ([DefaultProbeTimeout] for Probe, [DefaultRPCTimeout] for the
// others; see [WithProbeTimeout] and [WithRPCTimeout]). Errors are wrapped
// with the method name ("NodeStageVolume: rpc error: ...") and keep their
// gRPC status reachable through errors.As, status.FromError and [Code].
// Answers that break the spec (GetPluginInfo without a name, CreateVolume
// without a volume_id, ...) fail with [ErrInvalidResponse].
//
// Interceptors record csiactor_csi_operations_seconds ([NewMetrics],
// [WithMetrics]) and, at debug level, log each call with its request and
// response rendered by [Sanitize]: every field marked with the csi_secret
// option (found through protobuf reflection, so new spec fields are covered)
// and every mount flag is replaced by [Stripped]. When a plugin echoes a
// request's secrets or mount flags in an error message, they are removed
// from the returned error too.
//
// [Classify] is the single place that decides what a gRPC status code means
// for a publish-type or an unpublish-type call; [RetryCall] and [Backoff] are
// the retry helpers built on it, and every caller uses them.
//
// The capability model ([AccessMode], [AttachmentMode], [MountOptions],
// [VolumeCapability]) parses the kebab-case names used in the API and the
// config file, converts to and from the CSI protobufs, and prints without
// ever showing mount flags, whatever the fmt verb.
//
// # Caveats
//
// Identity RPCs (Probe, GetPluginInfo, GetPluginCapabilities) are never
// retried by this package: the allocation actor's heartbeat is their retry.
//
// When the plugin goes away, [Client.State] leaves READY at once (watch it
// with [Client.WaitForStateChange]) and settles on IDLE; the connection is
// re-established by the next RPC, so a heartbeat Probe both notices a
// restarted plugin and reconnects to it.
//
// Scrubbing errors can only remove the secrets of the request that failed:
// a plugin that prints some other secret in an error is not caught.
package csi
