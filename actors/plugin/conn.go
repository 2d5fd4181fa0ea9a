package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/connectivity"

	"github.com/csiactor/csiactor/csi"
)

// handoff passes a dialed client from the dial goroutine to the actor. A
// slot rather than the message itself, so that teardown can close a client
// whose message never got processed.
type handoff struct {
	mu sync.Mutex
	c  csi.Client // guarded by mu
}

func (h *handoff) put(c csi.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c = c
}

func (h *handoff) take() csi.Client {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.c
	h.c = nil
	return c
}

func (a *Actor) dialOptions() []csi.Option {
	opts := []csi.Option{
		csi.WithPluginName(a.spec.Plugin),
		csi.WithLogger(a.log),
		csi.WithProbeTimeout(a.cfg.ProbeTimeout),
		csi.WithRPCTimeout(a.cfg.RPCTimeout),
	}
	if a.cfg.Metrics != nil {
		opts = append(opts, csi.WithMetrics(a.cfg.Metrics))
	}
	if a.cfg.HungRPCRestart > 0 && a.spec.Type.Serves(Node) {
		opts = append(opts, csi.WithCallObserver(a.observeCall))
	}
	return opts
}

// dial connects in a goroutine, attempt after attempt, until it succeeds
// or the incarnation ends. Each failed attempt is reported to the actor.
func (a *Actor) dial() {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		pause := 50 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(a.ctx, a.cfg.DialTimeout)
			c, err := csi.Dial(ctx, a.spec.Endpoint(), a.dialOptions()...)
			cancel()
			if err == nil {
				a.handoff.put(c)
				a.send(&dialed{owner: a})
				return
			}
			if a.ctx.Err() != nil {
				return
			}
			a.send(&dialed{owner: a, err: err})
			t := time.NewTimer(pause)
			select {
			case <-a.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(2*pause, time.Second)
		}
	}()
}

// warnUnanswered logs, as a warning, that the plugin's socket does not
// answer: once it has not for SocketWarnAfter, then again after doubling
// intervals up to SocketWarnMax, so that a socket that never appears stays
// visible in the log without flooding it.
func (a *Actor) warnUnanswered(err error) {
	now := time.Now()
	if a.dialSince.IsZero() {
		a.dialSince = now
		a.dialWarnEvery = a.cfg.SocketWarnAfter
		a.dialWarnAt = now.Add(a.dialWarnEvery)
	}
	if now.Before(a.dialWarnAt) {
		return
	}
	a.log.WithError(err).WithFields(logrus.Fields{
		"socket":  a.spec.Socket,
		"waiting": now.Sub(a.dialSince).Round(time.Millisecond).String(),
	}).Warn("plugin socket does not answer; still trying")
	a.dialWarnEvery = min(2*a.dialWarnEvery, a.cfg.SocketWarnMax)
	a.dialWarnAt = now.Add(a.dialWarnEvery)
}

// watch sends connChanged when the connection enters or leaves READY.
func (a *Actor) watch(c csi.Client) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		s := c.State()
		ready := s == connectivity.Ready
		for c.WaitForStateChange(a.ctx, s) {
			s = c.State()
			if s == connectivity.Shutdown {
				return
			}
			if (s == connectivity.Ready) != ready {
				ready = !ready
				a.send(&connChanged{owner: a, state: s})
			}
		}
	}()
}

func (a *Actor) onDialed(ctx actor.Context, m *dialed) {
	if a.done {
		return
	}
	if m.err != nil {
		if a.answered(m.err) {
			a.report(ctx)
			return
		}
		if a.client == nil && !a.procDown() {
			a.setHealth(false, "connecting: "+m.err.Error())
			a.warnUnanswered(m.err)
			a.report(ctx)
		}
		return
	}
	c := a.handoff.take()
	if c == nil {
		return
	}
	if !a.dialSince.IsZero() && a.dialWarnAt.After(a.dialSince.Add(a.cfg.SocketWarnAfter)) {
		a.log.Info("plugin socket answers now")
	}
	a.dialSince = time.Time{}
	a.client = c
	a.status.Client = c
	a.log.Debug("connected to plugin")
	a.watch(c)
	a.fingerprintNow()
	a.report(ctx)
}

// onConnChanged reacts to the connection at once: leaving READY means the
// plugin went away (the client has no idle timeout), so the allocation is
// unhealthy now; either way a fingerprint runs to confirm.
func (a *Actor) onConnChanged(ctx actor.Context, m *connChanged) {
	if a.done || a.procDown() {
		return
	}
	if m.state != connectivity.Ready {
		a.nodeTimeouts = 0 // the plugin went away: whatever comes back starts afresh
		a.setHealth(false, fmt.Sprintf("connection to plugin lost (%s)", m.state))
		a.report(ctx)
	}
	a.fingerprintNow()
}

func (a *Actor) onHeartbeat(ctx actor.Context) {
	if a.done {
		return
	}
	if a.client == nil || a.procDown() {
		a.heart.Reset(a.cfg.HeartbeatInterval)
		return
	}
	a.fingerprintNow()
}

// procDown reports whether this is an exec-managed allocation whose process
// is not running; its status then describes the exit and is not replaced
// by connection or fingerprint results.
func (a *Actor) procDown() bool {
	return a.spec.ExecManaged() && a.proc == nil || a.spec.ContainerManaged() && a.ctr == nil
}

// fingerprintNow starts a fingerprint in a goroutine, or asks for another
// one after the running one.
func (a *Actor) fingerprintNow() {
	if a.done || a.client == nil || a.procDown() {
		return
	}
	if a.fpActive {
		a.fpAgain = true
		return
	}
	a.fpActive = true
	c := a.client
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(a.ctx, a.cfg.FingerprintTimeout)
		fp, err := fingerprint(ctx, c, a.spec.Type)
		cancel()
		if a.ctx.Err() != nil {
			return
		}
		a.send(&fingerprinted{owner: a, fp: fp, err: err})
	}()
}

func (a *Actor) onFingerprinted(ctx actor.Context, m *fingerprinted) {
	a.fpActive = false
	if a.done {
		return
	}
	if !a.procDown() && a.answered(m.err) {
		a.heart.Reset(a.cfg.UnhealthyRetry)
		a.fpAgain = false
		a.report(ctx)
		return
	}
	next := a.cfg.HeartbeatInterval
	switch {
	case a.procDown():
		// The process exited while the fingerprint ran; its exit wins.
	case m.err == nil:
		a.failures = 0
		a.status.Fingerprint = m.fp
		if !a.hungFingerprint() {
			a.setHealth(true, a.healthyDescription())
		}
	default:
		// A hung check stays pending: the plugin that answers again while
		// its node RPCs still time out in a row is hung (on a loaded
		// machine the check's own fingerprint can time out).
		a.failures++
		a.setHealth(false, describe(m.err))
		next = a.unhealthyDelay()
	}
	a.heart.Reset(next)
	if a.fpAgain {
		a.fpAgain = false
		a.fingerprintNow()
	}
	a.report(ctx)
}

// unhealthyDelay is UnhealthyRetry doubled per failure in a row, capped at
// HeartbeatInterval.
func (a *Actor) unhealthyDelay() time.Duration {
	d := a.cfg.UnhealthyRetry
	for i := 1; i < a.failures && d < a.cfg.HeartbeatInterval; i++ {
		d *= 2
	}
	return min(d, a.cfg.HeartbeatInterval)
}

func describe(err error) string {
	if errors.Is(err, ErrNotReady) {
		return "starting: plugin reports it is not ready"
	}
	return "fingerprint failed: " + err.Error()
}
