package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// classifyTable is the error classification of the csi package's doc
// (retry or final, by RPC kind), one row per gRPC code.
var classifyTable = []struct {
	code               codes.Code
	publish, unpublish Outcome
}{
	{codes.Canceled, Uncertain, Retry},
	{codes.Unknown, Final, Final},
	{codes.InvalidArgument, Final, Final},
	{codes.DeadlineExceeded, Uncertain, Retry},
	{codes.NotFound, Final, Success},
	{codes.AlreadyExists, Final, Final},
	{codes.PermissionDenied, Final, Final},
	{codes.ResourceExhausted, Retry, Retry},
	{codes.FailedPrecondition, Retry, Final},
	{codes.Aborted, Retry, Retry},
	{codes.OutOfRange, Final, Final},
	{codes.Unimplemented, Final, Final},
	{codes.Internal, Final, Final},
	{codes.Unavailable, Uncertain, Retry},
	{codes.DataLoss, Final, Final},
	{codes.Unauthenticated, Final, Final},
}

func TestClassify_Table(t *testing.T) {
	if len(classifyTable) != 16 {
		t.Fatalf("table covers %d codes, want all 16 non-OK codes", len(classifyTable))
	}
	for _, tt := range classifyTable {
		t.Run(tt.code.String(), func(t *testing.T) {
			err := fmt.Errorf("NodePublishVolume: %w", status.Error(tt.code, "x"))
			if got := Classify(PublishKind, err); got != tt.publish {
				t.Errorf("publish: %s, want %s", got, tt.publish)
			}
			if got := Classify(UnpublishKind, err); got != tt.unpublish {
				t.Errorf("unpublish: %s, want %s", got, tt.unpublish)
			}
			if got := Classify(RPCKind(0), err); got != tt.publish {
				t.Errorf("zero kind: %s, want the publish column %s", got, tt.publish)
			}
		})
	}
}

func TestClassify_NonStatusErrors(t *testing.T) {
	tests := []struct {
		name               string
		err                error
		publish, unpublish Outcome
	}{
		{"nil", nil, Success, Success},
		{"our deadline", context.DeadlineExceeded, Uncertain, Retry},
		{"our deadline wrapped", fmt.Errorf("NodeStageVolume: %w", context.DeadlineExceeded), Uncertain, Retry},
		{"our cancel", fmt.Errorf("x: %w", context.Canceled), Uncertain, Retry},
		{"invalid response", fmt.Errorf("CreateVolume: %w: volume is missing", ErrInvalidResponse), Final, Final},
		{"closed", fmt.Errorf("Probe: %w", ErrClosed), Final, Final},
		{"plain error", errors.New("boom"), Final, Final},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(PublishKind, tt.err); got != tt.publish {
				t.Errorf("publish: %s, want %s", got, tt.publish)
			}
			if got := Classify(UnpublishKind, tt.err); got != tt.unpublish {
				t.Errorf("unpublish: %s, want %s", got, tt.unpublish)
			}
		})
	}
}

func TestCode_DigsThroughWrapping(t *testing.T) {
	st := status.Error(codes.Aborted, "busy")
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{st, codes.Aborted},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", st)), codes.Aborted},
		{errors.Join(errors.New("other"), st), codes.Aborted},
		{fmt.Errorf("gave up: %w (last error: %w)", context.DeadlineExceeded, st), codes.Aborted},
		{context.Canceled, codes.Canceled},
		{errors.New("plain"), codes.Unknown},
	}
	for _, tt := range tests {
		if got := Code(tt.err); got != tt.want {
			t.Errorf("Code(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestOutcome_String(t *testing.T) {
	for o, want := range map[Outcome]string{Success: "success", Retry: "retry", Uncertain: "uncertain", Final: "final", 9: "outcome(9)"} {
		if got := o.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(o), got, want)
		}
	}
	for k, want := range map[RPCKind]string{PublishKind: "publish", UnpublishKind: "unpublish", 0: "rpc-kind(0)"} {
		if got := k.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(k), got, want)
		}
	}
	if !Retry.Retryable() || !Uncertain.Retryable() || Final.Retryable() || Success.Retryable() {
		t.Error("Retryable is wrong")
	}
}

// TestRetryCall_EveryCode_ThroughPlugin sends a publish-type call
// (NodePublishVolume) and an unpublish-type call (NodeUnpublishVolume) to a
// real plugin that fails twice with each code, and counts what reaches the
// plugin: retried codes make three calls and succeed, final codes one call
// and fail with the code, NotFound on unpublish one call and succeeds.
func TestRetryCall_EveryCode_ThroughPlugin(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{})
	fast := Backoff{Initial: time.Microsecond, Max: time.Microsecond, Multiplier: 1}
	target := t.TempDir() + "/target"
	publish := func(ctx context.Context) error {
		return c.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: target, VolumeCapability: mountCap()})
	}
	unpublish := func(ctx context.Context) error {
		return c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
	}
	calls := func(outcome Outcome) int {
		if outcome.Retryable() {
			return 3
		}
		return 1
	}
	for _, tt := range classifyTable {
		for _, side := range []struct {
			kind    RPCKind
			method  string
			fn      func(context.Context) error
			outcome Outcome
		}{
			{PublishKind, "NodePublishVolume", publish, tt.publish},
			{UnpublishKind, "NodeUnpublishVolume", unpublish, tt.unpublish},
		} {
			t.Run(tt.code.String()+"/"+side.kind.String(), func(t *testing.T) {
				before := p.Calls(side.method)
				p.SetFault(side.method, fakeplugin.Fault{Code: tt.code, Message: "injected", Times: 2})
				defer p.ClearFaults()
				var retried []codes.Code
				err := RetryCall(testCtx(t), fast, side.kind, side.method, side.fn,
					OnRetry(func(_ int, err error, _ time.Duration) { retried = append(retried, Code(err)) }))
				if got, want := p.Calls(side.method)-before, calls(side.outcome); got != want {
					t.Errorf("plugin saw %d calls, want %d", got, want)
				}
				switch side.outcome {
				case Final:
					if Code(err) != tt.code {
						t.Errorf("RetryCall = %v, want the final %s", err, tt.code)
					}
				default:
					if err != nil {
						t.Errorf("RetryCall = %v, want success", err)
					}
				}
				if side.outcome.Retryable() && (len(retried) != 2 || retried[0] != tt.code) {
					t.Errorf("OnRetry saw %v, want two %s", retried, tt.code)
				}
			})
		}
	}
}
