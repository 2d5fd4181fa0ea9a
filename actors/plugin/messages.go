package plugin

import (
	"google.golang.org/grpc/connectivity"

	"github.com/csiactor/csiactor/actors/plugin/proc"
)

// Reasons given in Shutdown; they become the final health description.
const (
	// ReasonShutdown is the final description when the agent stops.
	ReasonShutdown = "agent shutting down"
	// ReasonDeregistered is the final description of a deregistered
	// allocation. An exec-managed allocation also removes its socket
	// directory then.
	ReasonDeregistered = "deregistered"
)

// StatusChanged is sent to the parent (the registry) by an allocation actor
// whenever its Status changes: health, description, fingerprint, client or
// process. It and Stopped are sent with the actor as sender, so the parent
// can tell a current child from a previous incarnation's.
type StatusChanged struct {
	ID     string
	Status Status
}

// Stopped is sent to the parent by an allocation actor as its last message,
// when it has stopped its process, ended its goroutines, closed its client
// and run its last fingerprint. Status.Healthy is false and
// Status.Description is the reason (ReasonShutdown when the actor was
// stopped without a Shutdown).
type Stopped struct {
	ID     string
	Status Status
	Reason string
}

// Shutdown is sent to an allocation actor by its parent to stop it: the
// actor tears down, sends Stopped to the parent and stops itself. Reason
// is the final health description.
type Shutdown struct {
	Reason string
}

// GetStatus is sent to an allocation actor by anyone who wants its current
// Status; the actor responds with a Status.
type GetStatus struct{}

// Refingerprint is sent to an allocation actor by its parent when what the
// plugin announced may have changed (a ControllerPublishVolume answered
// ResourceExhausted, so max_volumes_per_node may be lower now): the actor
// fingerprints at once instead of at the next heartbeat, and reports the
// new Status as usual.
type Refingerprint struct{}

// Messages from the actor's own goroutines carry the actor incarnation that
// started them (owner): after a restart, results of the previous
// incarnation may still be in the mailbox and are ignored.

// heartbeat is sent to the actor by its heartbeat timer goroutine when a
// fingerprint is due.
type heartbeat struct{ owner *Actor }

// dialed is sent to the actor by its dial goroutine after each connection
// attempt. On success the client is in the actor's handoff slot (not in the
// message), so that a client dialed just before the actor stops is still
// closed.
type dialed struct {
	owner *Actor
	err   error
}

// connChanged is sent to the actor by its connection watcher goroutine when
// the gRPC connection enters or leaves READY.
type connChanged struct {
	owner *Actor
	state connectivity.State
}

// fingerprinted is sent to the actor by its fingerprint goroutine with the
// result of one fingerprint.
type fingerprinted struct {
	owner *Actor
	fp    Fingerprint
	err   error
}

// procExited is sent to the actor by its process watcher goroutine when the
// plugin process has exited and been reaped.
type procExited struct {
	owner *Actor
	p     *proc.Process
}

// restartProcess is sent to the actor by its restart timer goroutine when
// the backoff after a process exit has passed.
type restartProcess struct{ owner *Actor }

// nodeCallEnded is sent to the actor by the allocation's client (its call
// observer, on the caller's goroutine) when a node RPC that counts towards
// Config.HungRPCRestart ended: timedOut when it ended in
// DeadlineExceeded, else the plugin answered it.
type nodeCallEnded struct {
	owner    *Actor
	timedOut bool
}

// healthTimedOut is sent to the actor by its health timer goroutine when
// the allocation may have been unhealthy for Config.HealthTimeout.
type healthTimedOut struct{ owner *Actor }
