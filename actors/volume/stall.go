package volume

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// Stalled claims.
//
// A claim short of published, or a past claim not yet freed, "moves" when
// its state changes. One that has not moved for Config.StallAfter is
// stalled: its Condition is ConditionStalled (beside its LastError), it is
// an EventClaimStalled (once per stall) and it counts in
// csiactor_volume_claims_stalled {plugin}. It stops being stalled when it
// moves again, is published or freed, or its volume is deregistered.
// Nothing else changes: its steps go on retrying as before.
//
// The manager's stallBook follows every such claim from the snapshots its
// volume actors publish (Manager.publish): the time a claim entered its
// state is the claim's UpdatedAt when the book first sees it in that
// state (every transition sets UpdatedAt; a failed attempt sets it too but
// keeps the state, so it does not count as a move). After an agent
// restart, a claim's UpdatedAt is as close as the book gets to when it
// entered its state, which is at most as long ago as it really was. A
// watcher goroutine (stallWatch) looks at the book every quarter of
// Config.StallAfter (at most every minute, at least every millisecond).

// DefaultStallAfter is the default Config.StallAfter.
const DefaultStallAfter = 5 * time.Minute

// ConditionStalled is the Condition of a claim or past claim that has not
// moved (changed state) for Config.StallAfter; its LastError says why, when
// a step failed. It takes precedence over ConditionDegraded and
// ConditionRepairing: a repair that is stuck is stalled (its Repair still
// says what is repaired).
const ConditionStalled = "stalled"

// EventClaimStalled: a claim or past claim has not moved for
// Config.StallAfter; the message names its state and its last error.
// Reported once per stall (per agent run).
const EventClaimStalled = "claim-stalled"

// stallCheckMin and stallCheckMax bound how often the watcher looks.
const (
	stallCheckMin = time.Millisecond
	stallCheckMax = time.Minute
)

// stallKey names a claim (past false) or a past claim (past true) of a
// volume: an alloc may have both at once.
type stallKey struct {
	alloc string
	past  bool
}

// stallEntry follows one unfinished claim or past claim.
type stallEntry struct {
	state     string
	since     time.Time // when it entered state
	lastError string
	stalled   bool
	seen      uint64 // the stallVolume.gen that last saw it
}

// stallVolume is a volume with unfinished claims or past claims.
type stallVolume struct {
	plugin string
	claims map[stallKey]*stallEntry
	gen    uint64
}

// stallNote is a claim that stalled, or moved again after a stall.
type stallNote struct {
	volume, plugin string
	key            stallKey
	state          string
	lastError      string
}

// stallBook follows every unfinished claim and past claim. Volume actors
// write it (through Manager.publish and Manager.removed); the watcher,
// status reads and the metrics collector read it.
type stallBook struct {
	after time.Duration

	mu       sync.Mutex
	vols     map[string]*stallVolume // guarded by mu; only volumes with unfinished claims
	byPlugin map[string]int          // guarded by mu; stalled claims by plugin (kept at 0)
	// stalled counts every stalled claim, so that status reads skip the
	// lock when there is none.
	stalled atomic.Int64
}

func newStallBook(after time.Duration) *stallBook {
	return &stallBook{after: after, vols: map[string]*stallVolume{}, byPlugin: map[string]int{}}
}

// observe follows the record v of volume id (nil when it is gone) and
// returns the claims that were stalled and have moved since.
func (b *stallBook) observe(id string, v *persistence.Volume) []stallNote {
	b.mu.Lock()
	defer b.mu.Unlock()
	sv := b.vols[id]
	if sv == nil {
		if v == nil || !unfinishedClaims(v) {
			return nil
		}
		sv = &stallVolume{plugin: v.Plugin, claims: map[stallKey]*stallEntry{}}
		b.vols[id] = sv
		if _, ok := b.byPlugin[v.Plugin]; !ok {
			b.byPlugin[v.Plugin] = 0
		}
	}
	sv.gen++
	var moved []stallNote
	see := func(k stallKey, c *persistence.Claim) {
		if old, ok := b.seeLocked(sv, k, c); ok {
			moved = append(moved, stallNote{volume: id, plugin: sv.plugin, key: k, state: old})
		}
	}
	if v != nil {
		for i := range v.Claims {
			if c := &v.Claims[i]; c.State != claim.StatePublished {
				see(stallKey{alloc: c.Alloc}, c)
			}
		}
		for i := range v.PastClaims {
			see(stallKey{alloc: v.PastClaims[i].Alloc, past: true}, &v.PastClaims[i])
		}
	}
	for k, e := range sv.claims {
		if e.seen == sv.gen {
			continue
		}
		if e.stalled {
			b.unstallLocked(sv, e)
			moved = append(moved, stallNote{volume: id, plugin: sv.plugin, key: k, state: e.state})
		}
		delete(sv.claims, k)
	}
	if len(sv.claims) == 0 {
		delete(b.vols, id)
	}
	return moved
}

// seeLocked notes that the claim k of sv is c, as it is now. A claim in a
// new state starts again from its UpdatedAt, as a new entry; when it was
// stalled in its old state, that state is returned with ok true.
func (b *stallBook) seeLocked(sv *stallVolume, k stallKey, c *persistence.Claim) (old string, ok bool) {
	e := sv.claims[k]
	if e != nil && e.state != c.State {
		if e.stalled {
			b.unstallLocked(sv, e)
			old, ok = e.state, true
		}
		e = nil
	}
	if e == nil {
		e = &stallEntry{state: c.State, since: c.UpdatedAt}
		sv.claims[k] = e
	}
	e.lastError, e.seen = c.LastError, sv.gen
	return old, ok
}

// unstallLocked takes the stalled entry e of sv out of the counts; a moved
// entry (which is then dropped or replaced) is not counted again.
func (b *stallBook) unstallLocked(sv *stallVolume, e *stallEntry) {
	e.stalled = false
	b.byPlugin[sv.plugin]--
	b.stalled.Add(-1)
}

// unfinishedClaims reports whether v has a claim short of published or a
// past claim.
func unfinishedClaims(v *persistence.Volume) bool {
	if len(v.PastClaims) > 0 {
		return true
	}
	for i := range v.Claims {
		if v.Claims[i].State != claim.StatePublished {
			return true
		}
	}
	return false
}

// check marks the claims that have not moved for b.after as of now as
// stalled and returns them.
func (b *stallBook) check(now time.Time) []stallNote {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []stallNote
	for id, sv := range b.vols {
		for k, e := range sv.claims {
			if e.stalled || now.Sub(e.since) < b.after {
				continue
			}
			e.stalled = true
			b.byPlugin[sv.plugin]++
			b.stalled.Add(1)
			out = append(out, stallNote{volume: id, plugin: sv.plugin, key: k, state: e.state, lastError: e.lastError})
		}
	}
	return out
}

// overlay sets the Condition of v's stalled claims and past claims.
func (b *stallBook) overlay(v *Volume) {
	if b.stalled.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range v.Claims {
		b.markLocked(v.ID, &v.Claims[i], false)
	}
	for i := range v.PastClaims {
		b.markLocked(v.ID, &v.PastClaims[i], true)
	}
}

// overlayClaim is overlay for one claim of volume id (past: a past claim).
func (b *stallBook) overlayClaim(id string, c *Claim, past bool) {
	if b.stalled.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.markLocked(id, c, past)
}

// markLocked sets c's Condition when the book has it stalled in its state.
func (b *stallBook) markLocked(id string, c *Claim, past bool) {
	if sv := b.vols[id]; sv != nil {
		if e := sv.claims[stallKey{c.Alloc, past}]; e != nil && e.stalled && e.state == c.State {
			c.Condition = ConditionStalled
		}
	}
}

// counts returns the stalled claims by plugin.
func (b *stallBook) counts() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.byPlugin))
	for p, n := range b.byPlugin {
		out[p] = n
	}
	return out
}

// noteStalls follows the record v of volume id for stalls (see publish)
// and logs the claims that move again after one.
func (m *Manager) noteStalls(id string, v *persistence.Volume) {
	for _, n := range m.stalls.observe(id, v) {
		m.log.WithFields(logrus.Fields{"plugin": n.plugin, "volume": n.volume, "alloc": n.key.alloc, "state": n.state}).
			Info(claimKind(n.key) + " is no longer stalled: it moved on, or it is gone")
	}
}

func claimKind(k stallKey) string {
	if k.past {
		return "past claim"
	}
	return "claim"
}

// checkStalls reports the claims that have stalled by now: a warning and
// an EventClaimStalled each.
func (m *Manager) checkStalls(now time.Time) {
	for _, n := range m.stalls.check(now) {
		why := "no step has failed: it waits for its plugin or for the volume's other work"
		if n.lastError != "" {
			why = "last error: " + n.lastError
		}
		msg := fmt.Sprintf("%s has not moved from state %s for %s; %s", claimKind(n.key), n.state, m.cfg.StallAfter, why)
		m.log.WithFields(logrus.Fields{"plugin": n.plugin, "volume": n.volume, "alloc": n.key.alloc, "state": n.state}).Warn(msg)
		if m.cfg.OnEvent != nil {
			m.cfg.OnEvent(Event{Time: now, Type: EventClaimStalled, Plugin: n.plugin, Volume: n.volume, Alloc: n.key.alloc, Message: msg})
		}
	}
}

// stallWatch is the goroutine that checks for stalled claims; stop is
// closed to stop it, done when it has returned.
type stallWatch struct {
	stop chan struct{}
	done chan struct{}
}

// startStallWatch starts the watcher: every quarter of Config.StallAfter
// (within stallCheckMin and stallCheckMax) it calls checkStalls.
func (m *Manager) startStallWatch() *stallWatch {
	w := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	every := min(max(m.cfg.StallAfter/4, stallCheckMin), stallCheckMax)
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				m.checkStalls(time.Now())
			}
		}
	}()
	return w
}

// shutdown stops the watcher and waits for it; a nil watcher is a no-op.
func (w *stallWatch) shutdown() {
	if w == nil {
		return
	}
	close(w.stop)
	<-w.done
}

// stalledCollector exports csiactor_volume_claims_stalled {plugin} from
// the book: a plugin's series appears with its first claim followed (at
// 0) and stays.
type stalledCollector struct {
	book *stallBook
	desc *prometheus.Desc
}

func newStalledCollector(b *stallBook) *stalledCollector {
	return &stalledCollector{book: b, desc: prometheus.NewDesc(
		"csiactor_volume_claims_stalled",
		"Claims and past claims that have not changed state for volumes.stall_after (their condition is stalled), by plugin.",
		[]string{"plugin"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *stalledCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *stalledCollector) Collect(ch chan<- prometheus.Metric) {
	for p, n := range c.book.counts() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), p)
	}
}
