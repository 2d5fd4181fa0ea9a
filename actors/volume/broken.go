package volume

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"github.com/csiactor/csiactor/persistence"
)

// Events of dead mounts (see Manager.Reconcile and Config.MountProbe).
const (
	// EventMountBroken: a published claim's target or staging was in the
	// mount table but dead (ENOTCONN: a FUSE mount whose plugin died; EIO,
	// ESTALE, or a probe that did not answer); the claim is lost and goes
	// through its publish steps again. The message names the path and the
	// cause.
	EventMountBroken = "mount-broken"
	// EventMountHealed: a claim whose mount was found dead is published
	// again; the message says how long the heal took, and whether the
	// agent had to unmount the dead mount itself.
	EventMountHealed = "mount-healed"
)

// brokenBook follows the claims whose mount was found dead, from the check
// that found it to the claim published again (or gone), for
// csiactor_mounts_broken{plugin} and the heal time of EventMountHealed.
type brokenBook struct {
	total  *prometheus.CounterVec // csiactor_mounts_broken_total{plugin,cause}
	probes *prometheus.CounterVec // csiactor_mount_probes_total{plugin,result}

	mu      sync.Mutex
	claims  map[brokenKey]*brokenEntry // guarded by mu
	plugins map[string]struct{}        // guarded by mu; plugins seen, kept at 0
}

type brokenKey struct{ volume, alloc string }

type brokenEntry struct {
	plugin, path, cause string
	since               time.Time
	unmounted           []string // methods whose dead mount the agent unmounted
}

func newBrokenBook() *brokenBook {
	return &brokenBook{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_mounts_broken_total",
			Help: "Mounts of published claims found dead (in the mount table, but a stat fails with ENOTCONN, EIO or ESTALE, or does not answer: cause timeout), by plugin and cause. Each is healed by publishing the claim again.",
		}, []string{"plugin", "cause"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csiactor_mount_probes_total",
			Help: "Mount points of published claims probed by the host checks, by plugin and result: alive (the stat answered), dead (found broken), unknown (no place among the probes still outstanding).",
		}, []string{"plugin", "result"}),
		claims:  map[brokenKey]*brokenEntry{},
		plugins: map[string]struct{}{},
	}
}

// found records the claims of v that CheckHost sent back because a mount
// was dead, and returns their events.
func (b *brokenBook) found(v *persistence.Volume, allocs []string, now time.Time) []Event {
	var evs []Event
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, alloc := range allocs {
		i := claim.FindClaim(v.Claims, alloc)
		if i < 0 {
			continue
		}
		c := &v.Claims[i]
		cause := claim.BrokenCause(c.Repair)
		if cause == "" {
			continue
		}
		path := c.StagingPath
		if strings.HasPrefix(c.Repair, claim.RepairTarget) {
			path = c.TargetPath
		}
		k := brokenKey{v.ID, alloc}
		if _, ok := b.claims[k]; !ok {
			b.claims[k] = &brokenEntry{plugin: v.Plugin, path: path, cause: cause, since: now}
		}
		b.plugins[v.Plugin] = struct{}{}
		b.total.WithLabelValues(v.Plugin, cause).Inc()
		evs = append(evs, Event{Time: now, Type: EventMountBroken, Plugin: v.Plugin, Volume: v.ID, Alloc: alloc,
			Message: fmt.Sprintf("%s %s is dead (%s): unmounting and publishing it again", brokenWhat(c.Repair), path, cause)})
	}
	return evs
}

// brokenWhat is the part of a repair that names the path.
func brokenWhat(repair string) string {
	if strings.HasPrefix(repair, claim.RepairTarget) {
		return "target path"
	}
	return "staging path"
}

// unmounted notes that the agent unmounted a claim's dead mount itself
// because the plugin's method failed on it.
func (b *brokenBook) unmounted(volume, alloc, method string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.claims[brokenKey{volume, alloc}]; e != nil && !slices.Contains(e.unmounted, method) {
		e.unmounted = append(e.unmounted, method)
	}
}

// healed takes a claim published again out of the book, and returns its
// EventMountHealed (ok false when the book did not have it: it was not
// broken, or the agent restarted since).
func (b *brokenBook) healed(plugin, volume, alloc string, now time.Time) (Event, bool) {
	b.mu.Lock()
	e := b.claims[brokenKey{volume, alloc}]
	delete(b.claims, brokenKey{volume, alloc})
	b.mu.Unlock()
	if e == nil {
		return Event{}, false
	}
	msg := fmt.Sprintf("dead mount %s (%s) healed in %s", e.path, e.cause, now.Sub(e.since).Round(time.Millisecond))
	if len(e.unmounted) > 0 {
		msg += "; the plugin's " + strings.Join(e.unmounted, " and ") + " failed on the dead mount, so the agent unmounted it"
	}
	return Event{Time: now, Type: EventMountHealed, Plugin: plugin, Volume: volume, Alloc: alloc, Message: msg}, true
}

// Results of a probe, in csiactor_mount_probes_total.
const (
	probeAlive   = "alive"
	probeDead    = "dead"
	probeUnknown = "unknown"
)

// probed counts a probe of one of plugin's mount points.
func (b *brokenBook) probed(plugin string, r mountprobe.Result) {
	result := probeAlive
	switch {
	case r.Broken():
		result = probeDead
	case r.Unknown:
		result = probeUnknown
	}
	b.probes.WithLabelValues(plugin, result).Inc()
}

// seen makes plugin's csiactor_mounts_broken, csiactor_mounts_broken_total
// and csiactor_mount_probes_total series exist, at 0 until a mount of it
// is probed or found dead ("" does nothing).
func (b *brokenBook) seen(plugin string) {
	if plugin == "" {
		return
	}
	for _, r := range []string{probeAlive, probeDead, probeUnknown} {
		b.probes.WithLabelValues(plugin, r)
	}
	// A zero series per cause, so that increase() sees the first one.
	for _, c := range []string{mountprobe.CauseENOTCONN, mountprobe.CauseEIO, mountprobe.CauseESTALE, mountprobe.CauseTimeout} {
		b.total.WithLabelValues(plugin, c)
	}
	b.mu.Lock()
	b.plugins[plugin] = struct{}{}
	b.mu.Unlock()
}

// prune forgets the claims of plugin ("" for every plugin) that are no
// longer being repaired for a dead mount (released, deregistered, or healed
// unseen), given the ones that still are.
func (b *brokenBook) prune(plugin string, still map[brokenKey]struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, e := range b.claims {
		if _, ok := still[k]; !ok && (plugin == "" || e.plugin == plugin) {
			delete(b.claims, k)
		}
	}
}

// brokenCollector exports csiactor_mounts_broken{plugin}: the claims whose
// mount was found dead and that are not published again yet.
type brokenCollector struct {
	b    *brokenBook
	desc *prometheus.Desc
}

func newBrokenCollector(b *brokenBook) *brokenCollector {
	return &brokenCollector{b: b, desc: prometheus.NewDesc("csiactor_mounts_broken",
		"Claims whose mount was found dead and is not healed yet, by plugin.", []string{"plugin"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *brokenCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *brokenCollector) Collect(ch chan<- prometheus.Metric) {
	c.b.mu.Lock()
	n := make(map[string]int, len(c.b.plugins))
	for p := range c.b.plugins {
		n[p] = 0
	}
	for _, e := range c.b.claims {
		n[e.plugin]++
	}
	c.b.mu.Unlock()
	for p, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), p)
	}
}
