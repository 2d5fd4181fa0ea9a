package actorkit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// BackoffConfig is an exponential backoff with jitter and a cap, and a
// give-up threshold. The zero value of each field means its default.
type BackoffConfig struct {
	// Initial is the delay before the first retry. Default 100 ms.
	Initial time.Duration
	// Max caps every delay. Default 30 s.
	Max time.Duration
	// Multiplier is the growth factor between delays. Default 2.
	Multiplier float64
	// Jitter spreads each delay by up to ±Jitter of itself (0.2 = ±20%),
	// so failures that happened together do not retry together. Default
	// 0.2; set a negative value for no jitter.
	Jitter float64
	// MaxFailures is how many failures within Window are tolerated; one
	// more and the supervisor gives up. Default 10.
	MaxFailures int
	// Window is the period over which failures are counted. A child that
	// ran for longer than Window without failing starts again from
	// Initial. Default 1 minute.
	Window time.Duration
}

// DefaultBackoffConfig returns the defaults described on BackoffConfig.
func DefaultBackoffConfig() BackoffConfig {
	return BackoffConfig{
		Initial:     100 * time.Millisecond,
		Max:         30 * time.Second,
		Multiplier:  2,
		Jitter:      0.2,
		MaxFailures: 10,
		Window:      time.Minute,
	}
}

// WithDefaults returns c with every zero field set to its default.
func (c BackoffConfig) WithDefaults() BackoffConfig {
	d := DefaultBackoffConfig()
	if c.Initial == 0 {
		c.Initial = d.Initial
	}
	if c.Max == 0 {
		c.Max = d.Max
	}
	if c.Multiplier == 0 {
		c.Multiplier = d.Multiplier
	}
	if c.Jitter == 0 {
		c.Jitter = d.Jitter
	}
	if c.Jitter < 0 {
		c.Jitter = 0
	}
	if c.MaxFailures == 0 {
		c.MaxFailures = d.MaxFailures
	}
	if c.Window == 0 {
		c.Window = d.Window
	}
	return c
}

// Validate reports the first bad field, by name.
func (c BackoffConfig) Validate() error {
	switch {
	case c.Initial < 0:
		return fmt.Errorf("%w: initial must not be negative", ErrInvalidConfig)
	case c.Max < 0:
		return fmt.Errorf("%w: max must not be negative", ErrInvalidConfig)
	case c.Max > 0 && c.Initial > c.Max:
		return fmt.Errorf("%w: initial (%s) is above max (%s)", ErrInvalidConfig, c.Initial, c.Max)
	case c.Multiplier != 0 && c.Multiplier < 1:
		return fmt.Errorf("%w: multiplier must be at least 1", ErrInvalidConfig)
	case c.Jitter > 1:
		return fmt.Errorf("%w: jitter must be at most 1", ErrInvalidConfig)
	case c.MaxFailures < 0:
		return fmt.Errorf("%w: max_failures must not be negative", ErrInvalidConfig)
	case c.Window < 0:
		return fmt.Errorf("%w: window must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Delay returns the delay before retry number n (1 for the first retry),
// before jitter: Initial × Multiplier^(n-1), capped at Max. c must have
// its defaults applied.
func (c BackoffConfig) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := float64(c.Initial) * math.Pow(c.Multiplier, float64(n-1))
	if d > float64(c.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		return c.Max
	}
	return time.Duration(d)
}

// Jittered returns Delay(n) spread by ±Jitter, using r (a number in
// [0, 1)) as the random draw, and never above Max.
func (c BackoffConfig) Jittered(n int, r float64) time.Duration {
	d := float64(c.Delay(n))
	d *= 1 + c.Jitter*(2*r-1)
	if d > float64(c.Max) {
		d = float64(c.Max)
	}
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

// Next returns a jittered delay for retry n with a fresh random draw.
func (c BackoffConfig) Next(n int) time.Duration {
	return c.Jittered(n, rand.Float64())
}
