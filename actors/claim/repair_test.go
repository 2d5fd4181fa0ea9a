package claim

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/csiactor/csiactor/persistence"
)

type view struct{ mounted, linked []string }

func (v view) Mounted(p string) bool { return slices.Contains(v.mounted, p) }
func (v view) Linked(p string) bool  { return slices.Contains(v.linked, p) }

// hostVolume has claims a (published), b (published) and c (staged, its
// NodePublishVolume to come) sharing one staging, d reserved, all last
// changed at t0, controller-published; the staging was a mount point after
// NodeStageVolume.
func hostVolume(t0 time.Time) *persistence.Volume {
	cl := func(alloc, state string) persistence.Claim {
		return persistence.Claim{Alloc: alloc, State: state, StagingPath: "/s", TargetPath: "/t/" + alloc,
			ControllerRequired: true, UpdatedAt: t0}
	}
	return &persistence.Volume{
		ID: "v", ControllerPublished: true,
		Claims: []persistence.Claim{
			cl("a", StatePublished), cl("b", StatePublished), cl("c", StateStaged), cl("d", StateReserved),
		},
		Stagings: []persistence.Staging{{Path: "/s", Users: []string{"a", "b", "c", "d"}, Staged: true, Mounted: true}},
	}
}

func states(v *persistence.Volume) map[string]string {
	out := map[string]string{}
	for _, c := range v.Claims {
		out[c.Alloc] = c.State + "/" + c.Repair
	}
	return out
}

// replay drives the publish steps of allocs on v as the volume actor
// does (each step's claim queued again behind the others), every RPC
// succeeding, and returns the RPCs as "alloc:method".
func replay(t *testing.T, v *persistence.Volume, allocs []string, now time.Time) []string {
	t.Helper()
	var rpcs []string
	queue := slices.Clone(allocs)
	for n := 0; len(queue) > 0; n++ {
		if n > 100 {
			t.Fatalf("no end to the publish steps: %v", rpcs)
		}
		alloc := queue[0]
		queue = queue[1:]
		s, ok := NextPublish(v, alloc)
		if !ok {
			continue
		}
		rpcs = append(rpcs, alloc+":"+s.Method.String())
		ApplyPublish(v, s, Result{}, now)
		queue = append(queue, alloc)
	}
	return rpcs
}

func TestCheckHost(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	asOf, now := t0.Add(time.Second), t0.Add(2*time.Second)
	all := []string{"/s", "/t/a", "/t/b"}
	lost := func(why string) string { return StateLost + "/" + why }
	tests := []struct {
		name string
		host view
		// stagingNotMounted: NodeStageVolume left no mount at the
		// staging path (symlink mode, or a plugin like the hostpath
		// driver that stages without mounting).
		stagingNotMounted bool
		boot              bool
		asOf              time.Time
		wantRepaired      []string
		want              map[string]string
		wantStaged        bool
		wantCtrl          bool
		// wantRPCs are the repair's RPCs, until every claim is published.
		wantRPCs []string
	}{{
		name: "everything mounted", host: view{mounted: all}, asOf: asOf,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "one target missing", host: view{mounted: []string{"/s", "/t/a"}}, asOf: asOf,
		wantRepaired: []string{"b"},
		want:         map[string]string{"a": "published/", "b": lost(RepairTarget), "c": "staged/", "d": "reserved/"},
		wantStaged:   true, wantCtrl: true,
		wantRPCs: []string{"b:NodeUnpublishVolume", "b:NodePublishVolume"},
	}, {
		name: "staging missing: its published and staged users", host: view{mounted: []string{"/t/a", "/t/b"}}, asOf: asOf,
		wantRepaired: []string{"a", "b", "c"},
		want:         map[string]string{"a": lost(RepairStaging), "b": lost(RepairStaging), "c": lost(RepairStaging), "d": "reserved/"},
		wantCtrl:     true,
		// Every target unpublished before the staging is reset, the
		// staging reset before it is staged again.
		wantRPCs: []string{"a:NodeUnpublishVolume", "b:NodeUnpublishVolume", "c:NodeUnpublishVolume",
			"a:NodeUnstageVolume", "b:NodeStageVolume", "c:NodePublishVolume", "a:NodePublishVolume", "b:NodePublishVolume"},
	}, {
		name: "staging and one target missing", host: view{mounted: []string{"/t/a"}}, asOf: asOf,
		wantRepaired: []string{"a", "b", "c"},
		want:         map[string]string{"a": lost(RepairStaging), "b": lost(RepairStagingAndTarget), "c": lost(RepairStaging), "d": "reserved/"},
		wantCtrl:     true,
		wantRPCs: []string{"a:NodeUnpublishVolume", "b:NodeUnpublishVolume", "c:NodeUnpublishVolume",
			"a:NodeUnstageVolume", "b:NodeStageVolume", "c:NodePublishVolume", "a:NodePublishVolume", "b:NodePublishVolume"},
	}, {
		name: "symlink mode: staging is bookkeeping", host: view{linked: []string{"/t/a", "/t/b"}}, stagingNotMounted: true, asOf: asOf,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "staging never mounted: only the targets are checked", host: view{mounted: []string{"/t/a"}}, stagingNotMounted: true, asOf: asOf,
		wantRepaired: []string{"b"},
		want:         map[string]string{"a": "published/", "b": lost(RepairTarget), "c": "staged/", "d": "reserved/"},
		wantStaged:   true, wantCtrl: true,
		wantRPCs: []string{"b:NodeUnpublishVolume", "b:NodePublishVolume"},
	}, {
		name: "changed after the host was looked at", host: view{}, asOf: t0,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "boot changed: every claim, whatever is mounted", host: view{mounted: all}, boot: true, asOf: asOf,
		wantRepaired: []string{"a", "b", "c", "d"},
		want:         map[string]string{"a": lost(RepairBootID), "b": lost(RepairBootID), "c": lost(RepairBootID), "d": lost(RepairBootID)},
		wantRPCs: []string{"a:NodeUnpublishVolume", "b:NodeUnpublishVolume", "c:NodeUnpublishVolume", "d:NodeUnpublishVolume",
			"a:ControllerPublishVolume", "b:NodeUnstageVolume", "c:NodeStageVolume", "d:NodePublishVolume",
			"a:NodePublishVolume", "b:NodePublishVolume", "c:NodePublishVolume"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := hostVolume(t0)
			v.Stagings[0].Mounted = !tt.stagingNotMounted
			orig := CloneVolume(v)
			repaired, changed := CheckHost(v, tt.host, tt.boot, tt.asOf, now)
			slices.Sort(repaired)
			if !slices.Equal(repaired, tt.wantRepaired) {
				t.Errorf("repaired = %v, want %v", repaired, tt.wantRepaired)
			}
			if got := states(v); !maps.Equal(got, tt.want) {
				t.Errorf("claims = %v, want %v", got, tt.want)
			}
			if v.Stagings[0].Staged != tt.wantStaged || v.ControllerPublished != tt.wantCtrl {
				t.Errorf("staged %t, controller published %t; want %t, %t", v.Stagings[0].Staged, v.ControllerPublished, tt.wantStaged, tt.wantCtrl)
			}
			if changed != (len(tt.wantRepaired) > 0 || tt.boot) {
				t.Errorf("changed = %t", changed)
			}
			if Repairing(v) != (len(tt.wantRepaired) > 0) || Repairing(orig) {
				t.Errorf("Repairing = %t", Repairing(v))
			}
			// The plan takes it from here.
			if got := replay(t, v, repaired, now); !slices.Equal(got, tt.wantRPCs) {
				t.Errorf("repair RPCs:\n got %q\nwant %q", got, tt.wantRPCs)
			}
			if st := v.Stagings[0]; len(repaired) > 0 && (!st.Staged || st.Lost) {
				t.Errorf("after the repair the staging is %+v, want staged and not lost", st)
			}
		})
	}
}

func TestCheckHost_RepairClearedWhenPublished(t *testing.T) {
	t0 := time.Now()
	v := hostVolume(t0)
	CheckHost(v, view{mounted: []string{"/s"}}, false, t0.Add(time.Second), t0.Add(time.Second))
	replay(t, v, []string{"a"}, t0.Add(2*time.Second))
	if c := v.Claims[FindClaim(v.Claims, "a")]; c.State != StatePublished || c.Repair != "" {
		t.Errorf("after NodePublishVolume: %s, repair %q; want published, no repair", c.State, c.Repair)
	}
}
