// Package actorkit holds the small pieces every csiactor actor package
// shares on top of protoactor-go.
//
// # Basics
//
//   - [NewSlogHandler] forwards protoactor's slog records to a logrus entry,
//     and [SystemOptions] / [NewSystem] build an actor system that logs
//     through it with protoactor's built-in metrics left off.
//   - [Backoff] is an [actor.SupervisorStrategy]: one-for-one, exponential
//     delay with jitter and a cap between restarts of a failing child, and a
//     give-up (stop the child, tell the parent with [ChildGaveUp]) after too
//     many failures within a window.
//   - [RestartCounter] feeds csiactor_actor_restarts_total {kind}.
//   - [Broker] fans events out to subscribers without letting a slow one
//     stall the publisher (bounded queue per subscriber, oldest dropped,
//     a lag marker in their place).
//   - [Request] asks an actor from outside the actor system with a context:
//     it returns when the reply arrives, the context ends, or the timeout
//     passes, whichever is first.
//
// # Caveats
//
// protoactor drops the message that made an actor fail, and a restarted
// actor starts from its producer again: state must be reloaded (from the
// store, or from the parent) in the actor's Started handler.
package actorkit
