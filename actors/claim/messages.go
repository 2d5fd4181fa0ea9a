package claim

// TurnRequest is sent to the volume actor by a claim actor when it is ready
// to run the next step of its release: when it starts (or restarts), and
// after it has waited out a failed step. The volume actor answers with a
// Turn when no other RPC of the volume is in flight, or with Freed.
type TurnRequest struct {
	Alloc string
}

// Turn is sent to a claim actor by its volume actor: run this one step now.
// The volume runs no other RPC until the claim actor's StepDone arrives.
type Turn struct {
	Step Step
}

// StepDone is sent to the volume actor by a claim actor when the step of its
// Turn finished. On success the volume records it and answers with the next
// Turn or with Freed; on failure it records the error, and the claim actor
// sends a new TurnRequest after its backoff.
type StepDone struct {
	Alloc  string
	Step   Step
	Result Result
}

// Freed is sent to a claim actor by its volume actor when the past claim is
// gone from the record; the claim actor stops.
type Freed struct{}

// stepFinished is sent to a claim actor by the goroutine that ran its step.
type stepFinished struct {
	owner *Actor
	step  Step
	res   Result
}

// pauseOver is sent to a claim actor by the goroutine that waited out a
// failure (backoff, then plugin health).
type pauseOver struct {
	owner *Actor
}
