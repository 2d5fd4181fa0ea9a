package csi

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// String returns "publish" or "unpublish".
func (k RPCKind) String() string {
	switch k {
	case PublishKind:
		return "publish"
	case UnpublishKind:
		return "unpublish"
	}
	return "rpc-kind(" + strconv.Itoa(int(k)) + ")"
}

// String returns "success", "retry", "uncertain" or "final".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Retry:
		return "retry"
	case Uncertain:
		return "uncertain"
	case Final:
		return "final"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Retryable reports whether a caller should try again: Retry or Uncertain.
func (o Outcome) Retryable() bool { return o == Retry || o == Uncertain }

// Code returns the gRPC status code carried by err, looking through any
// wrapping (errors.As). nil is codes.OK. An error without a gRPC status is
// codes.DeadlineExceeded or codes.Canceled when it wraps the matching
// context error, and codes.Unknown otherwise (ErrInvalidResponse and
// ErrClosed, for example).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil {
			return st.Code()
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Unknown
}

// Classify decides what a caller does with the result of an RPC of the given
// kind. It is the only place in csiactor that interprets gRPC codes; every
// retry loop and every actor asks it.
//
//	code                                          publish-type  unpublish-type
//	nil (OK)                                      Success       Success
//	DeadlineExceeded, Canceled, Unavailable       Uncertain     Retry
//	Aborted, ResourceExhausted                    Retry         Retry
//	FailedPrecondition                            Retry         Final
//	NotFound                                      Final         Success
//	anything else (InvalidArgument, Internal, …)  Final         Final
//
// Why:
//   - DeadlineExceeded, Canceled, Unavailable: the request may or may not
//     have reached the plugin and may have taken effect. For a publish that
//     is uncertain: the caller retries (CSI calls are idempotent) and, if it
//     gives up, must still tear down. For an unpublish a retry is all there
//     is to do. Errors without a gRPC status that wrap our own context's
//     error count as the matching code (see Code).
//   - Aborted (an operation on the volume is already in flight) and
//     ResourceExhausted are transient by the spec's own description.
//   - FailedPrecondition on publish means "not yet" (the volume is not
//     attached yet, still in use elsewhere): waiting can fix it. On
//     unpublish it means the plugin refuses the teardown in the volume's
//     current state; retrying the same call cannot change that.
//   - NotFound on unpublish means the thing is already gone: the goal is
//     reached. On publish the volume or node does not exist.
//   - Everything else says the request itself is wrong, unsupported or
//     refused, or the plugin failed in a way it does not call transient
//     (Internal, Unknown); retrying the same request is pointless.
//
// A kind other than PublishKind and UnpublishKind is treated as
// PublishKind, the cautious column. docs/architecture.md ("Plugin errors")
// says what each caller does with a final outcome.
func Classify(kind RPCKind, err error) Outcome {
	if err == nil {
		return Success
	}
	unpublish := kind == UnpublishKind
	switch Code(err) {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable:
		if unpublish {
			return Retry
		}
		return Uncertain
	case codes.Aborted, codes.ResourceExhausted:
		return Retry
	case codes.FailedPrecondition:
		if unpublish {
			return Final
		}
		return Retry
	case codes.NotFound:
		if unpublish {
			return Success
		}
		return Final
	default:
		return Final
	}
}

// Unanswered reports whether err says that the plugin did not answer the
// call at all (DeadlineExceeded, Canceled, Unavailable), as opposed to
// answering with an error. The agent takes a plugin process that was
// running before it started and does not answer for hung.
func Unanswered(err error) bool {
	switch Code(err) {
	case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable:
		return err != nil
	}
	return false
}
