// Package metrictest reads single samples out of a Prometheus registry in
// tests, where comparing whole expositions (testutil.GatherAndCompare)
// does not fit: a counter that keeps growing, or one series among many.
package metrictest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the first sample of the counter or gauge name
// in g whose labels include labels (it may have others), and whether there
// is one. A failed Gather fails t.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	var v float64
	found := false
	each(t, g, name, labels, func(x float64) bool {
		v, found = x, true
		return false
	})
	return v, found
}

// Sum returns the sum of the samples of the counter or gauge name in g
// whose labels include labels (0 when there is none). A failed Gather fails
// t.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	each(t, g, name, labels, func(x float64) bool {
		sum += x
		return true
	})
	return sum
}

// each calls fn with the value of every sample of name in g whose labels
// include labels, until fn returns false.
func each(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string, fn func(float64) bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %s", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := make(map[string]string, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			v := m.GetGauge().GetValue()
			if c := m.GetCounter(); c != nil {
				v = c.GetValue()
			}
			if !fn(v) {
				return
			}
		}
	}
}
