// Package snapshot is the snapshot actor: it owns the records of the
// snapshots taken through the agent and drives CreateSnapshot and
// DeleteSnapshot to their end, one persisted step at a time.
//
// # Basics
//
// One actor holds every snapshot record (snapshots are few and each one is
// independent of the others); the RPCs run in goroutines it owns, so its
// mailbox never waits for a plugin. A snapshot is recorded as "creating"
// before the first CreateSnapshot is sent, and as "deleting" before the
// first DeleteSnapshot: an agent killed at any point calls them again when
// it starts (both are idempotent: CreateSnapshot by name, DeleteSnapshot
// by ID), so a snapshot is never lost nor taken twice. Retryable failures
// (see csi.Classify: CreateSnapshot is classified as a publish-type call,
// DeleteSnapshot as an unpublish-type one) are retried with backoff,
// waiting for the plugin to be healthy; a final one ends the step.
//
// A volume being restored from a snapshot holds it (Manager.Hold): the
// snapshot cannot be deleted until the restore has ended.
//
// # Caveats
//
// Holds are not persisted: a restore is a CreateVolume its caller waits
// for, and it ends with the agent.
package snapshot
