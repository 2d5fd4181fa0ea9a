// Package csi is csiactor's one door to a CSI plugin.
//
// # Basics
//
// [Dial] opens one gRPC connection to a plugin's unix socket and returns a
// [Client]. Every RPC carries its own timeout (the probe timeout for Probe,
// the RPC timeout for everything else). Interceptors log each call with
// secrets stripped (every field marked with the csi_secret option, found
// through protobuf reflection) and record csiactor_csi_operations_seconds.
//
// [Classify] is the single place that decides what a gRPC status code means
// for a publish-type or an unpublish-type call; [RetryCall] and [Backoff] are the
// retry helpers built on it, and every caller uses them.
//
// The capability model ([AccessMode], [AttachmentMode], [MountOptions],
// [VolumeCapability]) parses the kebab-case names used in the API and the
// config file, converts to and from the CSI protobufs, and prints without
// ever showing mount flags.
//
// # Caveats
//
// Identity RPCs (Probe, GetPluginInfo, GetPluginCapabilities) are never
// retried by this package: the allocation actor's heartbeat is their retry.
package csi
