// Package claim holds the life of one claim on a volume: the rules that
// decide whether a claim may be taken (the access-mode table), where it is
// staged and published on the host, the CSI steps that publish it and tear it
// down, and the claim actor that drives a released claim to "freed".
//
// # Basics
//
// A claim's steps are pure functions over a [persistence.Volume] record:
// [Reserve] adds a claim, [NextPublish] says which RPC comes next and
// [ApplyPublish] records its success; [Retire] turns a claim into a past
// claim, [AdvanceRelease] says which release RPC comes next (folding the
// transitions that need no RPC) and [ApplyRelease] records its success. The
// volume actor (package actors/volume) is the only writer of the record: it
// calls these functions and persists the result before the next RPC starts.
//
// A [Runner] executes one [Step]: it bounds the RPCs in flight per plugin,
// finds the plugin's current client through [Plugins], sends the RPC and
// classifies the result with [csi.Classify].
//
// The claim actor ([NewProps]) is a child of its volume actor, one per past
// claim. It asks its parent for a [Turn], runs that one step in a goroutine it
// owns, reports a [StepDone], and on failure waits (backoff, then until the
// plugin is healthy) before asking again, until the parent says [Freed].
//
// # Caveats
//
// Teardown never gives up: a failed release step stays in its state and is
// retried with backoff until it succeeds; the state and the last error are
// visible in the volume's status. NotFound on an unpublish-type RPC counts as
// success (the thing is already gone).
package claim
