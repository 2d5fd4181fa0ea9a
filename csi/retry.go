package csi

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/sirupsen/logrus"
)

// Backoff is an exponential backoff with jitter and a cap. The zero value of
// Initial, Max and Multiplier means the DefaultBackoff value of that field;
// Jitter is taken as given (0 means no jitter).
type Backoff struct {
	// Initial is the delay before the first retry.
	Initial time.Duration
	// Max caps every delay, jitter included.
	Max time.Duration
	// Multiplier scales the delay after each attempt; at least 1.
	Multiplier float64
	// Jitter spreads each delay uniformly over ±Jitter of its value, so
	// that many volumes retrying together do not hit a plugin in lockstep;
	// between 0 and 1.
	Jitter float64
}

// DefaultBackoff returns the backoff of claim and release steps: 500 ms, doubling, ±20%
// jitter, capped at 2 minutes.
func DefaultBackoff() Backoff {
	return Backoff{Initial: 500 * time.Millisecond, Max: 2 * time.Minute, Multiplier: 2, Jitter: 0.2}
}

// Validate reports the first field out of range, naming it.
func (b Backoff) Validate() error {
	d := b.withDefaults()
	switch {
	case b.Initial < 0:
		return fmt.Errorf("%w: backoff initial %s is negative", ErrInvalidOption, b.Initial)
	case b.Max < 0:
		return fmt.Errorf("%w: backoff max %s is negative", ErrInvalidOption, b.Max)
	case d.Max < d.Initial:
		return fmt.Errorf("%w: backoff max %s is less than initial %s", ErrInvalidOption, d.Max, d.Initial)
	case math.IsNaN(b.Multiplier) || b.Multiplier < 0 || (b.Multiplier > 0 && b.Multiplier < 1) || math.IsInf(b.Multiplier, 0):
		return fmt.Errorf("%w: backoff multiplier %g must be at least 1", ErrInvalidOption, b.Multiplier)
	case math.IsNaN(b.Jitter) || b.Jitter < 0 || b.Jitter > 1:
		return fmt.Errorf("%w: backoff jitter %g must be between 0 and 1", ErrInvalidOption, b.Jitter)
	}
	return nil
}

func (b Backoff) withDefaults() Backoff {
	def := DefaultBackoff()
	if b.Initial == 0 {
		b.Initial = def.Initial
	}
	if b.Max == 0 {
		b.Max = def.Max
	}
	if b.Multiplier == 0 {
		b.Multiplier = def.Multiplier
	}
	return b
}

// Delay returns how long to wait after the given failed attempt (0 for the
// first): Initial·Multiplier^attempt with jitter, capped at Max. It never
// returns a negative duration and never overflows, whatever attempt is. A
// Backoff that fails Validate gets its fields clamped into range.
func (b Backoff) Delay(attempt int) time.Duration {
	b = b.withDefaults()
	initial := max(float64(b.Initial), 0)
	maxD := max(float64(b.Max), initial)
	mult := b.Multiplier
	if !(mult >= 1) || math.IsInf(mult, 0) { // also catches NaN
		mult = 1
	}
	jitter := b.Jitter
	if !(jitter >= 0) { // also catches NaN
		jitter = 0
	}
	jitter = min(jitter, 1)

	attempt = max(attempt, 0)
	d := initial * math.Pow(mult, float64(attempt))
	if math.IsInf(d, 0) || math.IsNaN(d) || d > maxD {
		d = maxD
	}
	if jitter > 0 {
		d += d * jitter * (2*rand.Float64() - 1)
	}
	d = min(max(d, 0), maxD)
	return time.Duration(d)
}

// RetryOption configures RetryCall.
type RetryOption func(*retryOptions)

type retryOptions struct {
	metrics *Metrics
	plugin  string
	log     *logrus.Entry
	onRetry func(attempt int, err error, delay time.Duration)
}

// WithRetryMetrics counts each retry in csiactor_csi_retries_total of m with
// the given plugin label.
func WithRetryMetrics(m *Metrics, plugin string) RetryOption {
	return func(o *retryOptions) { o.metrics, o.plugin = m, plugin }
}

// WithRetryLogger logs each retry at info level and a NotFound that counts
// as success of an unpublish-type call at info level.
func WithRetryLogger(l *logrus.Entry) RetryOption { return func(o *retryOptions) { o.log = l } }

// OnRetry calls f before each wait, with the number of the attempt that
// failed (0 for the first), its error and the delay about to be waited.
func OnRetry(f func(attempt int, err error, delay time.Duration)) RetryOption {
	return func(o *retryOptions) { o.onRetry = f }
}

// RetryCall calls fn until Classify(kind, err) says Success (RetryCall returns nil)
// or Final (RetryCall returns fn's error), waiting b.Delay between attempts.
// Retry and Uncertain outcomes are retried. When ctx ends first, the error
// wraps both ctx.Err() and fn's last error, so errors.Is(err,
// context.DeadlineExceeded) and Code(err) both work. method names the call
// in errors, logs and metrics.
//
// Only publish-type and unpublish-type calls go through RetryCall. Identity
// RPCs (Probe, GetPluginInfo, GetPluginCapabilities) are never retried by
// the client: the allocation actor's heartbeat is their retry, and a failed
// heartbeat is news (the plugin is unhealthy), not noise to hide.
func RetryCall(ctx context.Context, b Backoff, kind RPCKind, method string, fn func(ctx context.Context) error, opts ...RetryOption) error {
	var o retryOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		switch Classify(kind, err) {
		case Success:
			if err != nil && o.log != nil {
				o.log.WithFields(logrus.Fields{"method": method, "grpc_code": Code(err).String()}).
					Info("already done; counting as success")
			}
			return nil
		case Final:
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %w)", method, attempt+1, ctx.Err(), err)
		}
		delay := b.Delay(attempt)
		if o.onRetry != nil {
			o.onRetry(attempt, err, delay)
		}
		if o.metrics != nil {
			o.metrics.retries.WithLabelValues(o.plugin, method).Inc()
		}
		if o.log != nil {
			o.log.WithError(err).WithFields(logrus.Fields{
				"method": method, "attempt": attempt + 1, "grpc_code": Code(err).String(), "delay": delay,
			}).Info("retrying CSI call")
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: gave up after %d attempts: %w (last error: %w)", method, attempt+1, ctx.Err(), err)
		case <-timer.C:
		}
	}
}
