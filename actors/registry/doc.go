// Package registry is the registry actor: it knows every plugin allocation
// on the host by plugin name and role (controller, node; a monolith is
// both), elects which one operations go to, publishes events, and persists
// and restores the allocations.
//
// # Basics
//
// Start the registry with [Start]; it returns a [Handle] whose blocking
// methods (ctx first) are the way to use it from outside the actor system:
// Register, Deregister, Allocations, Plugins, Plugin, Client, WaitHealthy,
// Subscribe and Shutdown. Inside the actor system the same messages (see
// messages.go) can be sent to Handle.PID.
//
// Election. The allocations of one plugin and role are ordered by the
// creation sequence the store assigned when each was first persisted, not
// by the order they were registered in: the newest is the singleton, so an
// agent restart that re-registers allocations in any order never lets an
// older one take over. Operations go to the newest healthy allocation (the
// active one): the singleton while it is healthy, an older healthy one
// while it is not, and back to the singleton when it recovers. A
// deregistered singleton hands over at once.
//
// Registration is idempotent: the same ID with the same spec is a no-op
// (and restarts an allocation whose actor had given up). The same ID with a
// different spec is refused with [ErrConflict]: deregister it first.
// Deregistration removes exactly the named allocation, both roles of a
// monolith, and returns when its actor has stopped (and, for an
// exec-managed allocation, its process is gone).
//
// Sources. Every allocation records where it came from ([Source]): the
// config file or the API. The config file is authoritative for the
// allocations it lists: Start is given them (Config.ConfigAllocations) and
// makes the store agree before it restores anything, so an agent whose
// config changed while it was down starts with the new specs and never
// runs a process for an old one. A listed allocation whose stored spec
// differs is replaced and keeps its Seq (the configured slot is the same,
// so it never overtakes a newer API allocation of its plugin); one the
// config no longer lists is deregistered; an API allocation with a listed
// ID becomes the config's. Other API allocations survive any config. While
// the agent runs, Register through the API of a config allocation's ID is
// a no-op with its spec and ErrConflict ("change it there") with another;
// Deregister works on either, and a config allocation deregistered that
// way comes back on the next start, as a new allocation (a new Seq).
//
// Commands. A command's first element must be an absolute path or a bare
// name found in the agent's PATH when the allocation is registered; a
// relative path is refused ([plugin.Spec.Validate]).
//
// Events (registered, deregistered, health_changed, singleton_changed,
// active_changed) go to subscribers through an [actorkit.Broker]: a slow
// subscriber never stalls the registry; it loses its oldest undelivered
// events and receives one "lagged" event with the count in their place.
//
// Every change is persisted through [Store] (implemented by
// persistence.Store). On start every stored allocation is restored:
// exec-managed ones are started again (after killing a process left over
// by the previous agent), attached ones are dialed again, and all are
// fingerprinted.
//
// Shutdown stops every allocation actor, each runs its last fingerprint
// with a closed client, and the final "agent shutting down" state of each
// is persisted before Shutdown returns.
//
// # Caveats
//
// A panic in an allocation actor restarts that actor alone, with
// exponential backoff; after Config.Supervisor.MaxFailures failures within
// its window the registry gives up on it and marks it unhealthy ("failed:
// …") until it is registered again. A panic in the registry itself
// restarts the registry, which stops its allocation actors and restores
// them from the store.
package registry
