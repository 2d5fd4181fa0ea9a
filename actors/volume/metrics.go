package volume

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/persistence"
)

// allStates are the claim states reported by csiactor_volume_claims, in
// order; freed claims are gone from the records, so they are never counted.
var allStates = []string{
	claim.StateReserved, claim.StateControllerPublished, claim.StateStaged, claim.StatePublished, claim.StateLost,
	claim.StateTaken, claim.StateNodeDetached, claim.StateControllerDetached, claim.StateReadyToFree,
}

var allModes = []string{string(claim.ModeRead), string(claim.ModeWrite)}

type countKey struct{ state, mode string }

// addCounts adds (sign 1) or removes (sign -1) v's claims and past claims
// to counts.
func addCounts(counts map[countKey]int, v *persistence.Volume, sign int) {
	if v == nil {
		return
	}
	for i := range v.Claims {
		counts[countKey{v.Claims[i].State, v.Claims[i].Mode}] += sign
	}
	for i := range v.PastClaims {
		counts[countKey{v.PastClaims[i].State, v.PastClaims[i].Mode}] += sign
	}
}

// claimsCollector exports csiactor_volume_claims from the manager's counts,
// which volume actors keep up to date from every snapshot they publish
// (passivated volumes keep their last counts).
type claimsCollector struct {
	m    *Manager
	desc *prometheus.Desc
}

func newClaimsCollector(m *Manager) *claimsCollector {
	return &claimsCollector{m: m, desc: prometheus.NewDesc(
		"csiactor_volume_claims",
		"Claims and past claims on volumes, by state and mode.",
		[]string{"state", "mode"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *claimsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *claimsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.countsMu.Lock()
	vals := make([]float64, 0, len(allStates)*len(allModes))
	for _, s := range allStates {
		for _, md := range allModes {
			vals = append(vals, float64(c.m.counts[countKey{s, md}]))
		}
	}
	c.m.countsMu.Unlock()
	i := 0
	for _, s := range allStates {
		for _, md := range allModes {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, vals[i], s, md)
			i++
		}
	}
}

// The results of csiactor_claim_repairs_total.
const (
	repairSucceeded = "success"
	repairFailed    = "failure"
)

// newRepairsCounter makes csiactor_claim_repairs_total: one success per
// claim published again after the host was found missing its volume, one
// failure per failed attempt of a repair step (each is retried).
func newRepairsCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "csiactor_claim_repairs_total",
		Help: "Repairs of claims whose volume the host was missing (target or staging not mounted, or a reboot), by plugin and result: success per claim published again, failure per failed attempt.",
	}, []string{"plugin", "result"})
}
