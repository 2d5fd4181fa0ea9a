// Package volume runs csiactor's volumes: one actor per volume that
// serializes its claims, publishes and releases, and a [Manager] that finds
// (or starts) the actor of a volume and answers status from snapshots.
//
// # Basics
//
// The runtime builds a Manager with [NewManager] (an actor system's root
// context, a [Config], a [Store] and a [Plugins]), calls [Manager.Start],
// and then the blocking, context-first methods: [Manager.Register],
// [Manager.Create], [Manager.Deregister], [Manager.Delete],
// [Manager.Claim], [Manager.Release], [Manager.Get], [Manager.List]; and
// [Manager.Shutdown] at the end.
//
// A claim goes through its steps one at a time, each recorded in the store
// before the next RPC starts: reserved (the claim and its usage count) →
// ControllerPublishVolume when the plugin needs it (controller-published,
// the publish context kept) → NodeStageVolume when the node plugin stages
// and this usage is not staged yet (staged) → NodePublishVolume to the
// allocation's target path (published). Claim returns when the claim is
// published. A release records the past claim (taken) and returns; a claim
// actor (package actors/claim) then unpublishes, unstages when it was the
// last user of its staging, and controller-unpublishes when no other claim
// on this host needs the volume, until the past claim is freed. Transitions
// that need no RPC (skipping a step that does not apply, controller-detached
// → ready-to-free → freed) are written together with the step before them,
// so a status read may never show them.
//
// docs/architecture.md ("Claims and releases", "Crash safety") walks
// through every state and what is on disk when.
//
// Paths: <data_dir>/volumes/<plugin>/staging/<volume>/<usage> and
// <data_dir>/volumes/<plugin>/per-alloc/<alloc>/<volume>/<usage>, where the
// usage is like "rw-file-system-single-node-writer".
//
// # Concurrency
//
// A volume actor is the only writer of its record. It runs at most one
// plugin RPC of its volume at a time, in a goroutine it owns, so its mailbox
// keeps serving: a claim request for another allocation is admitted or
// refused at once while a slow RPC runs. Status reads never go through the
// mailbox: Get answers from the snapshot the actor last persisted, or from
// the store. Different volumes run in parallel; a per-plugin bound
// ([Config.MaxInFlightPerPlugin]) keeps many volumes from swamping one
// plugin.
//
// Idle volume actors stop after [Config.IdleTimeout]; the manager keeps only
// the set of registered IDs (with the plugin volume of each) and the claim
// counts, and starts an actor again from the store when a request needs
// one.
//
// # Crashes and restarts
//
// A volume actor that panics is restarted by its supervisor (with backoff)
// and reloads its record; requests it held in memory are sent to it again
// by the manager (every request is idempotent). [Manager.Start] resumes
// every volume with an unfinished step: claims go forward to published,
// past claims to freed. Since every CSI call is idempotent, a step whose
// outcome was not recorded is simply sent again; a caller that retries the
// same claim gets the same target path.
//
// # The host
//
// The store is not trusted over the host. With [Config.Host] set,
// [Manager.Start] (before it resumes anything), [Manager.Reconcile] (the
// runtime calls it when a plugin's allocation is healthy again) and a
// repeated claim of a published claim compare the claims with the mount
// table: a claim whose target or staging path is not mounted goes back to
// reserved with its Repair set, and through its publish steps again;
// with [Config.HostRebooted], every current claim does, from
// ControllerPublishVolume on. A repair that fails is retried with backoff
// and never torn down (its Condition is degraded); [Manager.Repairing]
// lists the volumes still being repaired. See claim.CheckHost.
//
// # Usage and condition
//
// With [Config.StatsInterval] set, the manager polls the usage and
// condition of every volume with a published claim (NodeGetVolumeStats,
// and the condition RPCs the node plugin and its controller have), at
// most [Config.StatsConcurrency] at a time; [Manager.PollStats] runs one
// round at once. A volume actor polls in its slot, so never while a step
// of the volume runs. The results are in Volume.Usage and
// Volume.Condition, in the csiactor_volume_stats_* and
// csiactor_volume_condition_abnormal metrics, and a change of condition is
// an EventVolumeAbnormal or EventVolumeNormal; they are dropped when the
// volume's last published claim goes.
//
// # Stalls
//
// A claim short of published, or a past claim not yet freed, that has not
// changed state for [Config.StallAfter] is stalled: its Claim.Condition is
// [ConditionStalled] (before repairing and degraded), it is an
// [EventClaimStalled] once per stall, and it counts in
// csiactor_volume_claims_stalled {plugin}. Every failed claim step counts
// in csiactor_claim_step_failures_total {plugin, step, code}. A stall
// changes no step: they retry as before. See stall.go.
//
// # Caveats
//
// A publish step that fails with a retryable error (unavailable, timeout,
// aborted, resource exhausted, failed precondition) is retried with backoff,
// waiting for the plugin to be healthy, until it succeeds: a Claim whose
// plugin stays down waits until its context ends, and the claim goes on
// retrying in the background (its status shows the last error and the
// attempts). Release stops such a claim and tears it down. A positive
// [Config.MaxClaimAttempts] bounds the attempts instead. A publish step
// that fails for good (a final error, or the bound reached) turns the claim
// into a past claim, torn down like a release, and Claim returns
// ErrClaimFailed. Release steps never give up: they retry with backoff,
// waiting for the plugin to be healthy, and show their last error in the
// status.
//
// One plugin volume (plugin and external ID) is registered under one ID
// at most, so that the limits of its access mode hold. Register checks a
// volume with the plugin's ValidateVolumeCapabilities only when a
// controller of the plugin can answer at the time; otherwise the volume is
// registered unchecked (logged at info) and its first claim finds out.
// [Manager.Mirror] takes a definition another host of the cluster
// registered without asking the plugin at all.
//
// Volume and allocation IDs and plugin names become path components: they
// may not contain "/" or control characters. Secrets and mount flags never
// appear in logs, errors or status.
package volume
