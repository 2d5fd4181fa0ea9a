package csi

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBackoff_Delay_NoJitter(t *testing.T) {
	b := DefaultBackoff()
	b.Jitter = 0
	want := []time.Duration{
		500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, 64 * time.Second, 2 * time.Minute, 2 * time.Minute,
	}
	for attempt, w := range want {
		if got := b.Delay(attempt); got != w {
			t.Errorf("Delay(%d) = %s, want %s", attempt, got, w)
		}
	}
	for _, attempt := range []int{64, 1000, 1 << 40, math.MaxInt} {
		if got := b.Delay(attempt); got != 2*time.Minute {
			t.Errorf("Delay(%d) = %s, want the 2m cap", attempt, got)
		}
	}
	if got := b.Delay(-3); got != 500*time.Millisecond {
		t.Errorf("Delay(-3) = %s, want the initial delay", got)
	}
}

func TestBackoff_Delay_JitterStaysInBounds(t *testing.T) {
	b := DefaultBackoff()
	for attempt := range 40 {
		base := min(float64(b.Initial)*math.Pow(2, float64(attempt)), float64(b.Max))
		lo, hi := time.Duration(base*0.8), time.Duration(min(base*1.2, float64(b.Max)))
		seen := map[time.Duration]bool{}
		for range 50 {
			d := b.Delay(attempt)
			if d < lo || d > hi {
				t.Fatalf("Delay(%d) = %s, outside [%s, %s]", attempt, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Fatalf("Delay(%d) gave one value in 50 draws: no jitter", attempt)
		}
	}
}

func TestBackoff_Delay_ZeroValueUsesDefaults(t *testing.T) {
	var b Backoff // Jitter 0: deterministic
	if got := b.Delay(0); got != 500*time.Millisecond {
		t.Fatalf("Backoff{}.Delay(0) = %s", got)
	}
	if got := b.Delay(100); got != 2*time.Minute {
		t.Fatalf("Backoff{}.Delay(100) = %s", got)
	}
}

func TestBackoff_Delay_InvalidFieldsClamped(t *testing.T) {
	for _, b := range []Backoff{
		{Initial: -time.Second, Max: -time.Second, Multiplier: -2, Jitter: -1},
		{Initial: time.Second, Max: time.Millisecond, Multiplier: math.NaN(), Jitter: math.NaN()},
		{Initial: time.Hour, Multiplier: math.Inf(1), Jitter: 5},
	} {
		for _, attempt := range []int{0, 1, 50, math.MaxInt} {
			if d := b.Delay(attempt); d < 0 {
				t.Errorf("%+v.Delay(%d) = %s, negative", b, attempt, d)
			}
		}
	}
}

func TestBackoff_Validate(t *testing.T) {
	tests := []struct {
		name string
		b    Backoff
		want string
	}{
		{"default", DefaultBackoff(), ""},
		{"zero value", Backoff{}, ""},
		{"no jitter", Backoff{Initial: time.Second, Max: time.Second, Multiplier: 1}, ""},
		{"negative initial", Backoff{Initial: -1}, "backoff initial -1ns is negative"},
		{"negative max", Backoff{Max: -time.Second}, "backoff max -1s is negative"},
		{"max below initial", Backoff{Initial: time.Minute, Max: time.Second}, "backoff max 1s is less than initial 1m0s"},
		{"max below default initial", Backoff{Max: time.Millisecond}, "backoff max 1ms is less than initial 500ms"},
		{"multiplier below 1", Backoff{Multiplier: 0.5}, "backoff multiplier 0.5 must be at least 1"},
		{"multiplier NaN", Backoff{Multiplier: math.NaN()}, "backoff multiplier NaN"},
		{"jitter above 1", Backoff{Jitter: 1.5}, "backoff jitter 1.5 must be between 0 and 1"},
		{"jitter negative", Backoff{Jitter: -0.1}, "backoff jitter -0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.b.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %s", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidOption containing %q", err, tt.want)
			}
		})
	}
}

func TestRetryCall_ContextEnds_WrapsBoth(t *testing.T) {
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	slow := Backoff{Initial: time.Hour, Max: time.Hour}
	attempts := 0
	err := RetryCall(ctx, slow, PublishKind, "NodeStageVolume",
		func(context.Context) error {
			attempts++
			return status.Error(codes.Unavailable, "plugin restarting")
		},
		OnRetry(func(attempt int, _ error, delay time.Duration) {
			if delay != time.Hour {
				t.Errorf("delay = %s", delay)
			}
			cancel() // the caller gives up during the first wait
		}))
	if attempts != 1 {
		t.Fatalf("attempts = %d, want 1", attempts)
	}
	if !errors.Is(err, context.Canceled) || Code(err) != codes.Unavailable {
		t.Fatalf("err = %v: want both context.Canceled and the Unavailable status", err)
	}
	if want := "NodeStageVolume: gave up after 1 attempts: context canceled (last error: rpc error: code = Unavailable desc = plugin restarting)"; err.Error() != want {
		t.Fatalf("err = %q\nwant %q", err, want)
	}
	if got := Classify(PublishKind, err); got != Uncertain {
		t.Fatalf("Classify(gave-up error) = %s, want uncertain: teardown must still run", got)
	}
}

func TestRetryCall_ContextAlreadyDone_OneAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	attempts := 0
	err := RetryCall(ctx, Backoff{}, UnpublishKind, "NodeUnpublishVolume", func(ctx context.Context) error {
		attempts++
		return status.FromContextError(ctx.Err()).Err()
	})
	if attempts != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("attempts %d, err %v", attempts, err)
	}
}

func TestRetryCall_Final_ReturnsSameError(t *testing.T) {
	final := status.Error(codes.InvalidArgument, "bad volume id")
	attempts := 0
	err := RetryCall(testCtx(t), Backoff{}, PublishKind, "NodePublishVolume", func(context.Context) error {
		attempts++
		return final
	})
	if attempts != 1 || !errors.Is(err, final) {
		t.Fatalf("attempts %d, err %v", attempts, err)
	}
}

func TestRetryCall_CountsRetriesInMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	fast := Backoff{Initial: time.Microsecond, Max: time.Microsecond}
	failures := []codes.Code{codes.Aborted, codes.ResourceExhausted}
	err = RetryCall(testCtx(t), fast, UnpublishKind, "NodeUnstageVolume", func(context.Context) error {
		if len(failures) == 0 {
			return nil
		}
		c := failures[0]
		failures = failures[1:]
		return status.Error(c, "busy")
	}, WithRetryMetrics(m, "fake.csi"))
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP csiactor_csi_retries_total Retries of CSI RPCs after a transient or uncertain failure, by plugin and method.
# TYPE csiactor_csi_retries_total counter
csiactor_csi_retries_total{method="NodeUnstageVolume",plugin="fake.csi"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csiactor_csi_retries_total"); err != nil {
		t.Fatal(err)
	}
}

func TestRetryCall_Logs(t *testing.T) {
	log, buf := debugLogger("text")
	fast := Backoff{Initial: time.Microsecond, Max: time.Microsecond}
	n := 0
	err := RetryCall(testCtx(t), fast, UnpublishKind, "NodeUnpublishVolume", func(context.Context) error {
		n++
		if n == 1 {
			return status.Error(codes.Unavailable, "restarting")
		}
		return status.Error(codes.NotFound, "gone")
	}, WithRetryLogger(log))
	if err != nil {
		t.Fatalf("NotFound on unpublish should be success: %v", err)
	}
	out := buf.String()
	for _, want := range []string{"retrying CSI call", "grpc_code=Unavailable", "already done; counting as success", "grpc_code=NotFound", "method=NodeUnpublishVolume"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
