package actorkit

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestBackoffConfig_Validate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   BackoffConfig
		field string // "" means valid
	}{
		{"zero is valid", BackoffConfig{}, ""},
		{"defaults are valid", DefaultBackoffConfig(), ""},
		{"negative initial", BackoffConfig{Initial: -1}, "initial"},
		{"negative max", BackoffConfig{Max: -1}, "max"},
		{"initial above max", BackoffConfig{Initial: 2 * time.Second, Max: time.Second}, "initial"},
		{"multiplier below one", BackoffConfig{Multiplier: 0.5}, "multiplier"},
		{"jitter above one", BackoffConfig{Jitter: 1.5}, "jitter"},
		{"negative max failures", BackoffConfig{MaxFailures: -1}, "max_failures"},
		{"negative window", BackoffConfig{Window: -1}, "window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig naming %q", err, tt.field)
			}
		})
	}
}

func TestBackoffConfig_Delay_ExponentialWithCap(t *testing.T) {
	c := BackoffConfig{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}.WithDefaults()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := c.Delay(i + 1); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	if got := c.Delay(10000); got != time.Second {
		t.Errorf("Delay(10000) = %s, want the cap", got)
	}
}

func TestBackoffConfig_Jittered_Bounds(t *testing.T) {
	c := BackoffConfig{Initial: time.Second, Max: 10 * time.Second, Jitter: 0.25}.WithDefaults()
	if got := c.Jittered(1, 0); got != 750*time.Millisecond {
		t.Errorf("Jittered(1, 0) = %s, want 750ms", got)
	}
	if got := c.Jittered(1, 0.5); got != time.Second {
		t.Errorf("Jittered(1, 0.5) = %s, want 1s", got)
	}
	if got := c.Jittered(1, 1); got != 1250*time.Millisecond {
		t.Errorf("Jittered(1, 1) = %s, want 1.25s", got)
	}
	if got := c.Jittered(50, 1); got != 10*time.Second {
		t.Errorf("Jittered(50, 1) = %s, want the cap 10s", got)
	}
	noJitter := BackoffConfig{Initial: time.Second, Jitter: -1}.WithDefaults()
	if got := noJitter.Jittered(1, 0); got != time.Second {
		t.Errorf("no jitter: Jittered(1, 0) = %s, want 1s", got)
	}
}
