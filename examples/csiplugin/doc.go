// Package csiplugin is csiactor's example CSI plugin: a real plugin whose
// volumes are directories on the local host. `csiactor agent -dev` runs it
// (through a hidden subcommand that calls [Run]) as an exec-managed
// monolith allocation, and it passes the kubernetes-csi sanity suite.
//
// # Basics
//
// [Run] serves the identity, controller and node services on a unix
// socket until its context is done, then stops gracefully and removes the
// socket. [New], [Plugin.Serve] and [Plugin.Stop] do the same in pieces.
//
//	err := csiplugin.Run(ctx, csiplugin.Config{
//		Endpoint: "unix:///run/example/csi.sock",
//		StateDir: "/var/lib/example",
//	})
//
// CreateVolume makes StateDir/volumes/<id>, where the id is derived from
// the volume name, so a retried create lands on the same directory.
// Capacity is recorded, not enforced. ControllerPublishVolume records the
// node (the plugin knows one node, its own NodeID) and returns a publish
// context. NodeStageVolume bind-mounts the volume directory onto the
// staging path; NodePublishVolume bind-mounts the staging path onto the
// target (read-only when the request, the access mode or the controller
// publication says so). The supported mount flags are ro, rw, nosuid,
// nodev, noexec, noatime, nodiratime and relatime; others are
// InvalidArgument. Every RPC is idempotent.
//
// Everything the plugin knows is in StateDir/state.json, rewritten
// atomically (temporary file, fsync, rename, fsync of the directory) on
// every change, so a restarted plugin knows its volumes, publications,
// stagings and targets. Changes are recorded before mounts are made, so a
// retry after a crash finishes a half-done stage or publish, and an
// unstage or unpublish cleans it up. StateDir/lock (flock) keeps a second
// instance off the same state dir.
//
// With [Config.SharedDir] (-shared-dir) the volumes, snapshots and state
// file live there instead, shared by every instance given the same dir,
// each with its own StateDir and NodeID: storage that several hosts
// reach. Each RPC takes an flock on SharedDir/lock and reads the state
// file afresh, so instances in different processes see each other's
// changes and never lose one. Any instance's controller publishes a volume
// to any of their nodes (and unpublishes it, as a CO fencing a dead host
// does), and a volume with a single-node access mode goes to one node at
// a time (FailedPrecondition for a second).
//
// With [Config.FUSE] (-fuse) NodeStageVolume mounts the volume directory
// at the staging path through FUSE, served by the plugin's own process
// (go-fuse's loopback file system, mounted with mount(2): root and
// /dev/fuse, no fusermount), and NodePublishVolume bind-mounts that
// staging onto the target. Killing the plugin then breaks its mounts as it
// breaks a FUSE driver's (an S3 or network file system driver): they stay
// in the mount table and every access fails with ENOTCONN. A new process
// treats a mount that answers ENOTCONN, EIO or ESTALE as dead: unpublish
// and unstage unmount it, stage and publish unmount it and mount anew.
// [Config.FUSEFailDeadUnmount] (-fuse-fail-dead-unmount) makes unpublish
// and unstage fail with Internal on a dead mount instead, for tests of a
// CO's own cleanup.
//
// # Caveats
//
// Bind mounts need root (CAP_SYS_ADMIN). Without it ([MountModeSymlink],
// the default for a non-root process) staging is bookkeeping only and the
// target path is a symlink to the volume directory: files written through
// the target land in the volume, but read-only publishing and mount flags
// are recorded and not enforced.
//
// NodeGetVolumeStats reports the real usage of the volume's directory:
// the blocks and the files in it, against the volume's capacity. The
// node service has GET_VOLUME_HEALTH: NodeGetVolumeHealth reports a volume
// as DEGRADED while the file StateDir/conditions/<volume id> exists (its
// first line is the message; see [ConditionsDir]), and INACCESSIBLE when
// its directory is gone.
//
// Only the mount access type is supported (block is InvalidArgument), and
// fs_type is ignored: a volume is a directory on StateDir's file system,
// its capacity a number it records (expansion changes the number). Staging
// and target paths must lie outside StateDir.
//
// In FUSE mode [Plugin.Stop] leaves the mounts dead, as the process's exit
// does: it aborts their connections through the fusectl file system
// (mounting a private instance when /sys/fs/fuse/connections has none). A
// process that unshared its mounts while a volume was staged holds a copy
// of the FUSE mount: unstage unmounts the plugin's own and returns (after
// waiting a few seconds for the server to end, and logging that it does
// not), and the copy is served until it goes or the plugin stops.
//
// Logs name the method, volume, gRPC code and duration of each call; they
// never contain a request, a secret or a mount flag, and neither do errors.
package csiplugin
