package volume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/kinderr"
)

// MaxClaimWait is the longest ClaimWait waits for a conflicting claim to
// go.
const MaxClaimWait = 10 * time.Minute

// claimWaitPoll is how often ClaimWait tries again when nothing changed on
// the volume here: a conflict with another host's claim (cluster mode)
// goes without a local change.
const claimWaitPoll = 5 * time.Second

// waitSet wakes the callers of ClaimWait when a volume's record changes.
// It holds one channel per watched volume, closed (and forgotten) at the
// volume's next change; no goroutine waits for a caller.
type waitSet struct {
	mu      sync.Mutex
	byID    map[string]*watch // guarded by mu
	closing chan struct{}     // closed when the manager shuts down
	once    sync.Once
}

type watch struct {
	ch chan struct{}
	n  int // callers watching ch
}

func newWaitSet() *waitSet {
	return &waitSet{byID: map[string]*watch{}, closing: make(chan struct{})}
}

// watch returns a channel closed at volume id's next change, and the
// function that stops watching it.
func (s *waitSet) watch(id string) (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.byID[id]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		s.byID[id] = w
	}
	w.n++
	done := false
	return w.ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if done {
			return
		}
		done = true
		if w.n--; w.n == 0 && s.byID[id] == w {
			delete(s.byID, id)
		}
	}
}

// changed wakes the watchers of volume id.
func (s *waitSet) changed(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.byID[id]; w != nil {
		close(w.ch)
		delete(s.byID, id)
	}
}

func (s *waitSet) close() { s.once.Do(func() { close(s.closing) }) }

// EventClaimWaiting: a claim that other claims keep out waits for them
// to go (ClaimWait); the message says how long at most, and why.
const EventClaimWaiting = "claim-waiting"

// waiting reports a claim that starts to wait, refused with err.
func (m *Manager) waiting(ctx context.Context, req ClaimRequest, wait time.Duration, err error) {
	m.log.WithFields(logrus.Fields{"volume": req.VolumeID, "alloc": req.Alloc, "wait": wait}).
		WithError(err).Warn("claim refused by other claims; waiting for them to go")
	if m.cfg.OnEvent == nil {
		return
	}
	plugin := ""
	if v, gerr := m.Get(ctx, req.VolumeID); gerr == nil {
		plugin = v.Plugin
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: EventClaimWaiting, Plugin: plugin, Volume: req.VolumeID, Alloc: req.Alloc,
		Message: fmt.Sprintf("claim waits up to %s for other claims to go: %s", wait, err)})
}

// waitable reports whether a refused claim may be admitted later without
// anyone changing the request: a claim or past claim holds its place.
func waitable(err error) bool {
	return errors.Is(err, ErrClaimLimit) || errors.Is(err, ErrInUse)
}

// ClaimWait is Claim, except that a claim refused because another claim
// holds its place (ErrClaimLimit), or because the allocation's previous
// claim is still being released (ErrInUse), is tried again whenever the
// volume changes, for up to wait (at most MaxClaimWait): a conflicting
// claim released, a past claim freed. After wait it returns the last
// refusal, saying how long it waited. It returns ctx's error when ctx ends
// first (a caller that goes away stops waiting), ErrShutdown when the
// manager shuts down. Waiting costs no goroutine: the caller's own waits.
func (m *Manager) ClaimWait(ctx context.Context, req ClaimRequest, wait time.Duration) (Claim, error) {
	if wait <= 0 || wait > MaxClaimWait {
		return Claim{}, kinderr.Errorf(ErrInvalid, "wait %s: want more than 0 and at most %s", wait, MaxClaimWait)
	}
	if err := req.validate(); err != nil {
		return Claim{}, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTimer(claimWaitPoll)
	defer poll.Stop()
	for attempt := 0; ; attempt++ {
		// Watched before the attempt: a change between the refusal and
		// the wait still wakes it.
		changed, stop := m.waits.watch(req.VolumeID)
		c, err := m.Claim(ctx, req)
		if err == nil || !waitable(err) {
			stop()
			return c, err
		}
		if attempt == 0 {
			m.waiting(ctx, req, wait, err)
		}
		poll.Reset(claimWaitPoll) // no stale tick since Go 1.23
		select {
		case <-changed:
		case <-poll.C:
		case <-deadline.C:
			stop()
			return Claim{}, fmt.Errorf("%w (waited %s for it to be freed)", err, wait)
		case <-ctx.Done():
			stop()
			return Claim{}, ctx.Err()
		case <-m.waits.closing:
			stop()
			return Claim{}, ErrShutdown
		}
		stop()
	}
}
