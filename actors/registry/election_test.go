package registry

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/persistence"
)

func TestElect(t *testing.T) {
	running := actor.NewPID("local", "x")
	mk := func(id string, seq uint64, typ plugin.Type, healthy, stopping bool) *entry {
		return &entry{
			rec:      persistence.Allocation{ID: id, Seq: seq},
			spec:     plugin.Spec{ID: id, Plugin: "p", Type: typ},
			pid:      running,
			status:   plugin.Status{Healthy: healthy},
			stopping: stopping,
		}
	}
	tests := []struct {
		name   string
		allocs []*entry
		role   plugin.Role
		want   choice
	}{
		{"none", nil, plugin.Node, choice{}},
		{"newest by seq, not by order", []*entry{mk("b", 9, plugin.Node, true, false), mk("a", 3, plugin.Node, true, false)}, plugin.Node, choice{"b", "b"}},
		{"unhealthy singleton: newest healthy serves", []*entry{mk("a", 1, plugin.Node, true, false), mk("b", 2, plugin.Node, true, false), mk("c", 3, plugin.Node, false, false)}, plugin.Node, choice{"c", "b"}},
		{"none healthy", []*entry{mk("a", 1, plugin.Node, false, false)}, plugin.Node, choice{"a", ""}},
		{"deregistering one does not count", []*entry{mk("a", 1, plugin.Node, true, false), mk("b", 2, plugin.Node, true, true)}, plugin.Node, choice{"a", "a"}},
		{"monolith counts as controller", []*entry{mk("c", 1, plugin.Controller, true, false), mk("m", 2, plugin.Monolith, true, false), mk("n", 3, plugin.Node, true, false)}, plugin.Controller, choice{"m", "m"}},
		{"monolith counts as node", []*entry{mk("m", 2, plugin.Monolith, true, false), mk("c", 3, plugin.Controller, true, false)}, plugin.Node, choice{"m", "m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]*entry{}
			for _, e := range tt.allocs {
				m[e.spec.ID] = e
			}
			if got := elect(candidates(m, key{"p", tt.role})); got != tt.want {
				t.Errorf("elect = %+v, want %+v", got, tt.want)
			}
		})
	}
}
