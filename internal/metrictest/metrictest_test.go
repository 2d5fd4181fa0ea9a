package metrictest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"a", "b"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "g"}, []string{"a"})
	reg.MustRegister(c, g)
	c.WithLabelValues("1", "x").Add(2)
	c.WithLabelValues("1", "y").Add(3)
	g.WithLabelValues("1").Set(7)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{"c_total", map[string]string{"a": "1", "b": "y"}, 3, true},
		{"c_total", map[string]string{"b": "x"}, 2, true},
		{"c_total", map[string]string{"a": "2"}, 0, false},
		{"g", map[string]string{"a": "1"}, 7, true},
		{"g", nil, 7, true},
		{"missing", nil, 0, false},
	} {
		if got, ok := Value(t, reg, tc.name, tc.labels); got != tc.want || ok != tc.ok {
			t.Errorf("Value(%s, %v) = %v, %t; want %v, %t", tc.name, tc.labels, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"a", "b"})
	reg.MustRegister(c)
	c.WithLabelValues("1", "x").Add(2)
	c.WithLabelValues("1", "y").Add(3)
	c.WithLabelValues("2", "y").Add(5)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"c_total", nil, 10},
		{"c_total", map[string]string{"a": "1"}, 5},
		{"c_total", map[string]string{"b": "y"}, 8},
		{"c_total", map[string]string{"a": "3"}, 0},
		{"missing", nil, 0},
	} {
		if got := Sum(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("Sum(%s, %v) = %v; want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
