// Package plugin is the allocation actor: one actor per plugin allocation
// (one running instance of a CSI plugin), spawned and supervised by the
// registry actor.
//
// # Basics
//
// The actor owns everything about its allocation:
//
//   - the plugin socket: it dials it with [csi.Dial] in a goroutine and
//     keeps the [csi.Client] for the allocation's lifetime (gRPC reconnects
//     on its own when the plugin comes back on the same socket);
//   - the heartbeat: a fingerprint (Probe, GetPluginInfo,
//     GetPluginCapabilities, the controller and/or node capabilities,
//     NodeGetInfo) on start and every Config.HeartbeatInterval, more often
//     while the allocation is unhealthy;
//   - for an exec-managed allocation, the plugin process (see package
//     proc): started with CSI_ENDPOINT set and a log shim that keeps its
//     output, or adopted when a previous agent left it running (same PID
//     and start time, and it answers on its socket; one that does not is
//     killed and replaced); restarted with exponential backoff when it
//     exits, stays unhealthy for Config.HealthTimeout or hangs its node
//     RPCs (Config.HungRPCRestart); stopped (one SIGTERM to the plugin,
//     then SIGKILL to its process group) on deregistration, and on
//     shutdown only with Config.StopOnShutdown: otherwise it is left
//     running for the next agent.
//
// Every change of health, fingerprint, client or process is sent to the
// parent as a [StatusChanged]. Death is noticed without waiting for the
// heartbeat: a process exit and the gRPC connection leaving READY each make
// the allocation unhealthy at once and trigger a fingerprint.
//
// RPCs never run on the actor's goroutine: dials and fingerprints run in
// goroutines the actor owns, which send their results back as messages.
// Timers are goroutines too (not protoactor's scheduler). All of them end,
// and are waited for, when the actor stops or restarts.
//
// On stop the actor runs a last fingerprint with its closed client, so its
// final state keeps the plugin's info and reads "unhealthy: agent shutting
// down" (or the reason given in [Shutdown]); it sends that to the parent as
// [Stopped].
//
// # Caveats
//
// A restarted actor (after a panic) starts from its spec again: it stops
// its process in Restarting and starts a new one. The message that failed
// is lost. An attached allocation unhealthy for Config.HealthTimeout is
// only described so ("not healthy for over …"): the agent does not run it.
package plugin
