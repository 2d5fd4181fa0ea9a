package volume

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

// Usage and condition polling.
//
// Every Config.StatsInterval (jittered by ±10 %), the manager's poller asks
// each volume with claims on this host, at most Config.StatsConcurrency at
// a time, to poll itself. The volume actor does it in its slot, so a poll
// never runs while a step of the volume (publish, release, expansion,
// create, delete) is in flight, and no step starts while a poll runs: it
// calls NodeGetVolumeStats on the target path of its first published
// claim when the node plugin has GET_VOLUME_STATS, NodeGetVolumeHealth
// when it has GET_VOLUME_HEALTH, and ControllerGetVolumeHealth or
// ControllerGetVolume on the plugin's controller when that has
// GET_VOLUME_HEALTH, or GET_VOLUME and VOLUME_CONDITION. A poll is bounded
// by Config.StatsTimeout and is not retried: the next one is the retry. A
// failed poll keeps the last values (a warning says why).
//
// The results live in the manager's statsBook until the volume has no
// published claim any more (a release, a repair) or is deregistered: the
// volume actor, which writes the book, also forgets its entry when it
// persists such a record, so the series of a released claim never come
// back.

// Defaults of the stats fields of Config.
const (
	// DefaultStatsConcurrency is how many volumes are polled at once.
	DefaultStatsConcurrency = 4
	// DefaultStatsTimeout bounds one volume's poll (all its RPCs).
	DefaultStatsTimeout = 30 * time.Second
)

// The events of a volume's condition.
const (
	// EventVolumeAbnormal: the plugin reports the volume's condition as
	// abnormal (first seen, or a new message); the message is the
	// plugin's.
	EventVolumeAbnormal = "volume-condition-abnormal"
	// EventVolumeNormal: a volume reported abnormal is normal again.
	EventVolumeNormal = "volume-condition-normal"
)

// Usage is how full a volume is, as its node plugin last reported it
// (NodeGetVolumeStats). Fields the plugin did not report are zero.
type Usage struct {
	CapacityBytes  int64     `json:"capacity_bytes,omitempty"`
	AvailableBytes int64     `json:"available_bytes,omitempty"`
	UsedBytes      int64     `json:"used_bytes,omitempty"`
	Inodes         int64     `json:"inodes,omitempty"`
	InodesFree     int64     `json:"inodes_free,omitempty"`
	InodesUsed     int64     `json:"inodes_used,omitempty"`
	CheckedAt      time.Time `json:"checked_at"`
}

// Condition is a volume's health as its plugin last reported it: Abnormal
// with the plugin's Message, or normal.
type Condition struct {
	Abnormal  bool      `json:"abnormal"`
	Message   string    `json:"message,omitempty"`
	CheckedAt time.Time `json:"checked_at"`
}

// statsEntry is what the book holds for one volume.
type statsEntry struct {
	plugin        string
	bytes, inodes *csi.Usage
	usageAt       time.Time
	cond          *Condition
	lastErr       string // of the last poll; "" when it succeeded
}

// statsBook holds the last usage and condition of every volume with a
// published claim. Volume actors write it; status reads and the metrics
// collector read it.
type statsBook struct {
	mu sync.Mutex
	m  map[string]*statsEntry // guarded by mu
}

func newStatsBook() *statsBook { return &statsBook{m: map[string]*statsEntry{}} }

func (b *statsBook) forget(id string) {
	b.mu.Lock()
	delete(b.m, id)
	b.mu.Unlock()
}

// record stores a poll's result for volume id of plugin and returns the
// condition it had before (nil when none).
func (b *statsBook) record(id, plugin string, p *statsPoll) (before *Condition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[id]
	if e == nil {
		e = &statsEntry{}
		b.m[id] = e
	}
	e.plugin = plugin
	before = e.cond
	if p.stats != nil {
		e.bytes, e.inodes, e.usageAt = p.stats.Bytes, p.stats.Inodes, p.at
	}
	if p.cond != nil {
		e.cond = &Condition{Abnormal: p.cond.Abnormal, Message: p.cond.Message, CheckedAt: p.at}
	}
	return before
}

// noteError records the error of a poll of volume id ("" for none) and
// reports whether it differs from the last poll's.
func (b *statsBook) noteError(id, plugin, msg string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[id]
	if e == nil {
		if msg == "" {
			return false
		}
		e = &statsEntry{plugin: plugin}
		b.m[id] = e
	}
	changed := e.lastErr != msg
	e.lastErr = msg
	return changed
}

// overlay sets v's Usage and Condition from the book.
func (b *statsBook) overlay(v *Volume) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[v.ID]
	if e == nil {
		return
	}
	if e.bytes != nil || e.inodes != nil {
		u := &Usage{CheckedAt: e.usageAt}
		if e.bytes != nil {
			u.CapacityBytes, u.AvailableBytes, u.UsedBytes = e.bytes.Total, e.bytes.Available, e.bytes.Used
		}
		if e.inodes != nil {
			u.Inodes, u.InodesFree, u.InodesUsed = e.inodes.Total, e.inodes.Available, e.inodes.Used
		}
		v.Usage = u
	}
	if e.cond != nil {
		c := *e.cond
		v.Condition = &c
	}
}

// statsRequest is sent to a volume actor by the manager's poller. The
// reply comes when the volume's usage and condition are polled and
// recorded, or at once when it has no published claim.
type statsRequest struct {
	reply chan<- reply
}

// statsFinished is sent to a volume actor by the goroutine that polled.
type statsFinished struct {
	owner *volumeActor
	req   *statsRequest
	poll  *statsPoll
}

// statsPoll is one poll's result: what was reported (nil when nothing
// was) and the errors of the RPCs that failed.
type statsPoll struct {
	stats *csi.VolumeStats
	cond  *csi.VolumeCondition
	at    time.Time
	err   error
}

// statsTarget returns the claim whose paths a poll uses: the first
// published one, or nil.
func statsTarget(v *persistence.Volume) *persistence.Claim {
	if v == nil {
		return nil
	}
	for i := range v.Claims {
		if v.Claims[i].State == claim.StatePublished {
			return &v.Claims[i]
		}
	}
	return nil
}

// pollStats starts a poll of the volume in the slot, or answers at once
// when it has no published claim. The slot is free.
func (a *volumeActor) pollStats(ctx actor.Context, req *statsRequest) {
	c := statsTarget(a.rec)
	if c == nil {
		a.m.stats.forget(a.h.id)
		answer(req.reply, reply{})
		return
	}
	v := a.rec
	target := pollTarget{
		plugin: v.Plugin, volumeID: v.ExternalID, path: c.TargetPath, staging: c.StagingPath, secrets: v.Secrets,
		id: v.ID, secretsFrom: v.SecretsFrom,
	}
	m := a.m
	a.occupy(ctx, slot{kind: slotOp}, func(jctx context.Context) any {
		pctx, cancel := context.WithTimeout(jctx, m.cfg.StatsTimeout)
		defer cancel()
		p := m.poll(pctx, target)
		if jctx.Err() != nil {
			return nil // stopping
		}
		return &statsFinished{owner: a, req: req, poll: p}
	})
}

func (a *volumeActor) statsFinished(ctx actor.Context, msg *statsFinished) {
	if msg.owner != a {
		return
	}
	a.vacate()
	if statsTarget(a.rec) != nil {
		a.recordPoll(msg.poll)
	}
	answer(msg.req.reply, reply{})
	a.settle(ctx)
}

// recordPoll stores a poll's result and reports a change of condition. A
// failed poll is logged at warning, and at debug while it fails the same
// way.
func (a *volumeActor) recordPoll(p *statsPoll) {
	msg := ""
	if p.err != nil {
		msg = p.err.Error()
	}
	if changed := a.m.stats.noteError(a.h.id, a.rec.Plugin, msg); p.err != nil {
		l := a.log.WithError(p.err)
		if changed {
			l.Warn("volume usage or condition poll failed; keeping the last values")
		} else {
			l.Debug("volume usage or condition poll failed again; keeping the last values")
		}
	}
	if p.stats == nil && p.cond == nil {
		return
	}
	before := a.m.stats.record(a.h.id, a.rec.Plugin, p)
	if p.cond == nil {
		return
	}
	now := *p.cond
	was := csi.VolumeCondition{}
	if before != nil {
		was = csi.VolumeCondition{Abnormal: before.Abnormal, Message: before.Message}
	}
	switch {
	case now.Abnormal && (!was.Abnormal || was.Message != now.Message):
		a.log.WithField("condition", now.Message).Warn("the plugin reports the volume's condition as abnormal")
		a.m.emitCondition(a.rec, EventVolumeAbnormal, "abnormal: "+messageOr(now.Message, "no message"))
	case !now.Abnormal && was.Abnormal:
		a.log.Info("the plugin reports the volume's condition as normal again")
		a.m.emitCondition(a.rec, EventVolumeNormal, "normal again"+suffix(now.Message))
	}
}

func messageOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func (m *Manager) emitCondition(v *persistence.Volume, typ, msg string) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: typ, Plugin: v.Plugin, Volume: v.ID, Message: msg})
}

// pollTarget is what a poll needs of the volume. It holds its secrets
// (for ControllerGetVolumeHealth): never log it.
type pollTarget struct {
	plugin, volumeID, path, staging string
	secrets                         map[string]string
	// id and secretsFrom: the volume's, when its secrets are read from
	// a file (at the RPC that needs them).
	id, secretsFrom string
}

// poll asks the plugin for the volume's usage and condition, through the
// runner (which bounds the RPCs in flight to the plugin).
func (m *Manager) poll(ctx context.Context, t pollTarget) *statsPoll {
	p := &statsPoll{}
	var errs []error
	var conds []namedCondition
	_, nf, err := m.plugins.Client(ctx, t.plugin, claim.NodePlugin)
	if err != nil {
		p.err = fmt.Errorf("%w: %s node: %w", ErrPluginUnavailable, t.plugin, err)
		p.at = time.Now()
		return p
	}
	if nf.VolumeStats {
		var st csi.VolumeStats
		res := m.runner.Do(ctx, t.plugin, claim.NodePlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
			var err error
			st, err = c.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{
				VolumeId: t.volumeID, VolumePath: t.path, StagingTargetPath: t.staging,
			})
			return err
		})
		if res.OK() {
			p.stats = &st
			if nf.NodeCondition && st.Condition != nil {
				conds = append(conds, namedCondition{"node", *st.Condition})
			}
		} else {
			errs = append(errs, res.Err)
		}
	}
	if nf.NodeHealth {
		var cond csi.VolumeCondition
		res := m.runner.Do(ctx, t.plugin, claim.NodePlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
			var err error
			cond, err = c.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: t.volumeID, VolumePublishPath: t.path})
			return err
		})
		if res.OK() {
			conds = append(conds, namedCondition{"node", cond})
		} else {
			errs = append(errs, res.Err)
		}
	}
	secrets, serr := readSecrets(t.id, t.secrets, t.secretsFrom)
	if serr != nil {
		errs = append(errs, serr)
	}
	if nf.ControllerService && serr == nil {
		if _, cf, err := m.plugins.Client(ctx, t.plugin, claim.ControllerPlugin); err == nil && (cf.ControllerHealth || cf.ControllerCondition) {
			var cond *csi.VolumeCondition
			res := m.runner.Do(ctx, t.plugin, claim.ControllerPlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
				if cf.ControllerHealth {
					h, err := c.ControllerGetVolumeHealth(ctx, &csipb.ControllerGetVolumeHealthRequest{VolumeId: t.volumeID, Secrets: secrets})
					cond = &h
					return err
				}
				h, err := c.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: t.volumeID})
				cond = h.Condition
				return err
			})
			switch {
			case !res.OK():
				errs = append(errs, res.Err)
			case cond != nil:
				conds = append(conds, namedCondition{"controller", *cond})
			}
		}
	}
	p.cond = combine(conds)
	p.err = errors.Join(errs...)
	p.at = time.Now()
	return p
}

// pollable reports whether plugin has a node allocation that answers and
// reports usage or a condition (or a controller that reports conditions).
func (m *Manager) pollable(ctx context.Context, plugin string) bool {
	s := m.statsSupport(ctx, plugin)
	return s.usage || s.condition
}

// Usage and condition statuses: Volume.UsageStatus and
// Volume.ConditionStatus, set while the volume has a published claim on
// this host.
const (
	// StatsReported: Usage (or Condition) holds what the plugin last
	// reported.
	StatsReported = "reported"
	// StatsPending: the plugin reports it (or its node plugin does not
	// answer now to say), and no poll has recorded it yet.
	StatsPending = "pending"
	// StatsUnsupported: the plugin does not report it: its node plugin
	// has no GET_VOLUME_STATS (usage), and neither it nor its controller
	// reports a volume's condition.
	StatsUnsupported = "unsupported"
)

// statsSupport is what a plugin's allocations report of a volume; known
// is false when its node plugin does not answer now.
type statsSupport struct {
	usage, condition, known bool
}

// statsSupport asks plugin's node plugin (and its controller, when the
// node plugin reports no condition) what a poll gets of a volume: usage
// with GET_VOLUME_STATS; a condition with VOLUME_CONDITION (in the
// stats), GET_VOLUME_HEALTH, or the controller's GET_VOLUME_HEALTH or
// GET_VOLUME and VOLUME_CONDITION.
func (m *Manager) statsSupport(ctx context.Context, plugin string) statsSupport {
	_, nf, err := m.plugins.Client(ctx, plugin, claim.NodePlugin)
	if err != nil {
		return statsSupport{}
	}
	s := statsSupport{known: true, usage: nf.VolumeStats, condition: (nf.VolumeStats && nf.NodeCondition) || nf.NodeHealth}
	if !s.condition && nf.ControllerService {
		_, cf, err := m.plugins.Client(ctx, plugin, claim.ControllerPlugin)
		s.condition = err == nil && (cf.ControllerCondition || cf.ControllerHealth)
	}
	return s
}

// setStatsStatus sets v's UsageStatus and ConditionStatus when it has a
// published claim on this host. support, when not nil, caches
// statsSupport by plugin across the volumes of one listing.
func (m *Manager) setStatsStatus(ctx context.Context, v *Volume, support map[string]statsSupport) {
	published := false
	for _, c := range v.Claims {
		published = published || c.State == claim.StatePublished
	}
	if !published {
		return
	}
	s, ok := support[v.Plugin]
	if !ok {
		s = m.statsSupport(ctx, v.Plugin)
		if support != nil {
			support[v.Plugin] = s
		}
	}
	status := func(set, supported bool) string {
		switch {
		case set:
			return StatsReported
		case supported || !s.known:
			return StatsPending
		default:
			return StatsUnsupported
		}
	}
	v.UsageStatus = status(v.Usage != nil, s.usage)
	v.ConditionStatus = status(v.Condition != nil, s.condition)
}

type namedCondition struct {
	side string
	c    csi.VolumeCondition
}

// combine sums up the conditions the node and the controller reported:
// abnormal when either is, with the messages of the abnormal ones (of all,
// when none is), each prefixed with its side when both reported. Nil when
// none reported.
func combine(cs []namedCondition) *csi.VolumeCondition {
	if len(cs) == 0 {
		return nil
	}
	out := &csi.VolumeCondition{}
	for _, c := range cs {
		out.Abnormal = out.Abnormal || c.c.Abnormal
	}
	var msgs []string
	for _, c := range cs {
		if c.c.Message == "" || (out.Abnormal && !c.c.Abnormal) {
			continue
		}
		if len(cs) > 1 {
			msgs = append(msgs, c.side+": "+c.c.Message)
		} else {
			msgs = append(msgs, c.c.Message)
		}
	}
	out.Message = strings.Join(msgs, "; ")
	return out
}

// PollStats polls the usage and condition of every volume with claims on
// this host now, at most Config.StatsConcurrency at a time, and returns
// when every poll is recorded, or with ctx's error. Volumes of a plugin
// that reports neither usage nor conditions, or has no healthy node
// allocation now, are skipped without waking their actors. The manager
// calls it every Config.StatsInterval; tests and tools may call it in
// between.
func (m *Manager) PollStats(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrShutdown
	}
	byPlugin := make(map[string][]string, len(m.inUse))
	for plugin, vols := range m.inUse {
		for id := range vols {
			byPlugin[plugin] = append(byPlugin[plugin], id)
		}
	}
	m.mu.Unlock()
	var ids []string
	for plugin, vols := range byPlugin {
		if m.pollable(ctx, plugin) {
			ids = append(ids, vols...)
		}
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(m.cfg.StatsConcurrency, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				_, err := m.ask(ctx, id, false, func(ch chan<- reply) any { return &statsRequest{reply: ch} })
				if err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrShutdown) {
					m.log.WithError(err).WithField("volume", id).Warn("volume usage poll failed")
				}
			}
		}()
	}
feed:
	for _, id := range ids {
		select {
		case work <- id:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return ctx.Err()
}

// statsPoller runs PollStats every Config.StatsInterval, jittered, until
// stop is closed; done is closed when it has returned.
type statsPoller struct {
	stop chan struct{}
	done chan struct{}
}

func (m *Manager) startStatsPoller() *statsPoller {
	sp := &statsPoller{stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-sp.stop
		cancel()
	}()
	go func() {
		defer close(sp.done)
		defer cancel()
		// The first round comes at a random point of the first
		// interval, so that agents started together do not poll
		// together.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(m.cfg.StatsInterval)) + 1))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := m.PollStats(ctx); err != nil && ctx.Err() == nil {
				m.log.WithError(err).Warn("volume usage poll round failed")
			}
			t.Reset(jitter(m.cfg.StatsInterval))
		}
	}()
	return sp
}

// shutdown stops the poller and waits for it; a nil poller is a no-op.
func (sp *statsPoller) shutdown() {
	if sp == nil {
		return
	}
	close(sp.stop)
	<-sp.done
}

// jitter returns d varied randomly by up to ±10 %.
func jitter(d time.Duration) time.Duration {
	j := int64(d) / 10
	if j <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(2*j+1)-j)
}

// statsCollector exports the book: csiactor_volume_stats_* and
// csiactor_volume_condition_abnormal {plugin, volume}, shaped like
// kubelet_volume_stats_*.
type statsCollector struct {
	book                                  *statsBook
	capacity, available, used             *prometheus.Desc
	inodes, inodesFree, inodesUsed, abnml *prometheus.Desc
}

func newStatsCollector(b *statsBook) *statsCollector {
	labels := []string{"plugin", "volume"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	return &statsCollector{
		book:       b,
		capacity:   d("csiactor_volume_stats_capacity_bytes", "Capacity in bytes of the volume, as its node plugin reports it (NodeGetVolumeStats)."),
		available:  d("csiactor_volume_stats_available_bytes", "Number of available bytes in the volume."),
		used:       d("csiactor_volume_stats_used_bytes", "Number of used bytes in the volume."),
		inodes:     d("csiactor_volume_stats_inodes", "Maximum number of inodes in the volume."),
		inodesFree: d("csiactor_volume_stats_inodes_free", "Number of free inodes in the volume."),
		inodesUsed: d("csiactor_volume_stats_inodes_used", "Number of used inodes in the volume."),
		abnml:      d("csiactor_volume_condition_abnormal", "1 when the volume's plugin reports its condition as abnormal, 0 when normal."),
	}
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.capacity, c.available, c.used, c.inodes, c.inodesFree, c.inodesUsed, c.abnml} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		id string
		e  statsEntry
	}
	c.book.mu.Lock()
	rows := make([]row, 0, len(c.book.m))
	for id, e := range c.book.m {
		rows = append(rows, row{id, *e})
	}
	c.book.mu.Unlock()
	g := func(d *prometheus.Desc, v int64, r *row) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), r.e.plugin, r.id)
	}
	for i := range rows {
		r := &rows[i]
		if b := r.e.bytes; b != nil {
			g(c.capacity, b.Total, r)
			g(c.available, b.Available, r)
			g(c.used, b.Used, r)
		}
		if n := r.e.inodes; n != nil {
			g(c.inodes, n.Total, r)
			g(c.inodesFree, n.Available, r)
			g(c.inodesUsed, n.Used, r)
		}
		if cd := r.e.cond; cd != nil {
			v := int64(0)
			if cd.Abnormal {
				v = 1
			}
			g(c.abnml, v, r)
		}
	}
}
