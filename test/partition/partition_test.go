package partition

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// probesPerAgent is how many probe volumes each agent's prober cycles
// through: more than the claims it starts (one per 100 ms) while one
// is held up on a volume (by an etcd request in the partition, at most
// the agents' dial_timeout of 2 s).
const probesPerAgent = 30

// accessModeOf is the access mode of each test volume, by its name: the
// workers' volumes are single-writer, the probes' are not (they measure
// admission, not arbitration).
func accessModeOf(vol string) string {
	switch {
	case strings.HasPrefix(vol, "mnsw-"):
		return "multi-node-single-writer"
	case strings.HasPrefix(vol, "probe-"):
		return "multi-node-multi-writer"
	default: // snw-, pin-, hp-
		return "single-node-writer"
	}
}

// pinned is a claim published before the partitions, kept through them:
// its target stays mounted and its file readable and writable.
type pinned struct {
	host    *agent
	vol     string
	target  string
	content string
}

// TestPartitions runs three etcd members and three agents, each in its
// own network namespace, with workers on every agent claiming and
// releasing single-writer volumes, and partitions the network twice:
//
//  1. one agent is cut from every member, until the server expired its
//     lease, then healed;
//  2. the etcd leader's member is cut from the other members, until they
//     elected a new leader and every agent admitted claims under it, then
//     healed.
//
// Through both: no two claims of a single-writer volume were ever held at
// once (see holding); the cut agent refused claims before the server
// expired its lease (both times are logged); while the old leader is cut
// off, no agent's lease expires; the claims published before the
// partitions stay published, mounted, readable and writable on every
// host; after each heal every agent admits claims again and the members
// agree on a leader. At the end every claim is released in etcd.
func TestPartitions(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	n1 := c.agents[0]

	// The volumes: on the example plugin's shared storage, created
	// through n1 and claimable on every host; the hostpath driver's are
	// node-local, created through their host.
	shared := []string{"snw-0", "snw-1", "mnsw-0"}
	all := slices.Clone(shared)
	vols, probes := map[string][]string{}, map[string][]string{}
	for _, a := range c.agents {
		vols[a.node] = slices.Clone(shared)
		all = append(all, "pin-"+a.node)
		for i := range probesPerAgent {
			probes[a.node] = append(probes[a.node], fmt.Sprintf("probe-%s-%d", a.node, i))
		}
		all = append(all, probes[a.node]...)
	}
	for _, id := range all {
		createVolume(t, n1, id, "example")
	}
	if c.hostpath != "" {
		for _, a := range c.agents {
			for _, id := range []string{"hp-pin-" + a.node, "hp-w-" + a.node} {
				createVolume(t, a, id, hostpath.PluginName)
				all = append(all, id)
			}
			vols[a.node] = append(vols[a.node], "hp-w-"+a.node)
		}
	}
	for _, a := range c.agents {
		testbin.Eventually(t, "every volume on "+a.node, deadline, pollInterval, func() (bool, string) {
			vs, err := a.cl.Volumes(ctx, runtime.VolumeFilter{})
			if err != nil {
				return false, err.Error()
			}
			var missing []string
			for _, id := range all {
				if !slices.ContainsFunc(vs, func(v runtime.Volume) bool { return v.ID == id }) {
					missing = append(missing, id)
				}
			}
			return len(missing) == 0, fmt.Sprintf("missing %v", missing)
		})
	}

	// A claim published on every host before the partitions, with a file
	// written through it.
	var pins []*pinned
	for _, a := range c.agents {
		ids := []string{"pin-" + a.node}
		if c.hostpath != "" {
			ids = append(ids, "hp-pin-"+a.node)
		}
		for _, id := range ids {
			cl, err := a.cl.Claim(ctx, id, runtime.ClaimRequest{Alloc: "app-" + a.node, Mode: runtime.ModeWrite,
				AccessMode: accessModeOf(id), AttachmentMode: "file-system"})
			if err != nil || cl.State != "published" {
				t.Fatalf("claim %s on %s: %+v, %v", id, a.node, cl, err)
			}
			p := &pinned{host: a, vol: id, target: cl.TargetPath, content: id}
			if err := os.WriteFile(filepath.Join(p.target, "data.txt"), []byte(p.content), 0o600); err != nil {
				t.Fatal(err)
			}
			pins = append(pins, p)
		}
	}
	checkPinned(t, pins, "before the partitions")

	r := startRun(c.agents, vols, probes)
	defer r.end() // after a failure; the normal path ends it below
	for _, a := range c.agents {
		waitAdmitted(t, r, a, time.Now().Add(-time.Hour), "before the partitions")
	}

	// Case 1: n1 cut from every member.
	t.Log("case 1: an agent cut from etcd")
	w := c.watchAlive(c.members[1])
	c.net.cut(n1.node, "m1", "m2", "m3")
	cut := time.Now()
	t.Logf("%s: cut %s from every etcd member", cut.Format("15:04:05.000"), n1.node)
	var expired aliveEvent
	var seen []aliveEvent
	testbin.Eventually(t, "the server to expire "+n1.node+"'s lease", deadline, pollInterval, func() (bool, string) {
		seen = append(seen, w.drain()...)
		i := slices.IndexFunc(seen, func(ev aliveEvent) bool { return ev.node == n1.node && ev.deleted })
		if i >= 0 {
			expired = seen[i]
		}
		return i >= 0, fmt.Sprint(seen)
	})
	var refused outcome
	testbin.Eventually(t, n1.node+" to refuse a claim", deadline, pollInterval, func() (bool, string) {
		var ok bool
		refused, ok = r.firstRefusal(n1.node, cut)
		return ok, "no refusal yet"
	})
	t.Logf("%s: first refusal %s after the cut (claim sent %s after it: %s); lease expired on the server (key gone on %s) %s after the cut",
		n1.node, refused.answered.Sub(cut).Round(time.Millisecond), refused.sent.Sub(cut).Round(time.Millisecond), refused.err,
		c.members[1].name, expired.at.Sub(cut).Round(time.Millisecond))
	if !refused.answered.Before(expired.at) {
		t.Errorf("%s refused its first claim %s after the cut, not before the server expired its lease (%s after the cut)",
			n1.node, refused.answered.Sub(cut), expired.at.Sub(cut))
	}
	// The other hosts go on claiming without n1, and every published
	// claim works, n1's too.
	for _, a := range c.agents[1:] {
		waitAdmitted(t, r, a, expired.at, "while "+n1.node+" is cut off")
	}
	checkPinned(t, pins, "while "+n1.node+" is cut off")
	healed := time.Now()
	c.net.heal(n1.node)
	// No claim sent to n1 after the cut was admitted before the heal:
	// etcd never saw it. (A claim admitted just before the cut may be
	// answered after it, once published.)
	if o, ok := r.firstAdmitted(n1.node, cut); ok && o.answered.Before(healed) {
		t.Errorf("%s admitted claim %s on %s, sent %s after it was cut off from etcd, answered %s after",
			n1.node, o.alloc, o.vol, o.sent.Sub(cut), o.answered.Sub(cut))
	}
	waitAdmitted(t, r, n1, healed, "after the heal")
	testbin.Eventually(t, n1.node+"'s liveness key back", deadline, pollInterval, func() (bool, string) {
		seen = append(seen, w.drain()...)
		return slices.ContainsFunc(seen, func(ev aliveEvent) bool { return ev.node == n1.node && !ev.deleted && ev.at.After(healed) }), fmt.Sprint(seen)
	})
	w.cancel()
	c.waitLeader("the members to agree on a leader after the heal", c.members...)
	checkPinned(t, pins, "after "+n1.node+" was healed")

	// Case 2: the leader's member cut from the others.
	t.Log("case 2: the etcd leader's member cut from the other members")
	old := c.waitLeader("the members to agree on a leader", c.members...)
	var rest []*member
	var restNames []string
	for _, m := range c.members {
		if m != old {
			rest, restNames = append(rest, m), append(restNames, m.name)
		}
	}
	w = c.watchAlive(rest[0])
	for _, a := range c.agents {
		waitAdmitted(t, r, a, time.Now(), "before the leader's cut")
	}
	c.net.cut(old.name, restNames...)
	cut = time.Now()
	t.Logf("%s: cut the leader %s from %v", cut.Format("15:04:05.000"), old.name, restNames)
	var elected *member
	testbin.Eventually(t, "a new leader among "+strings.Join(restNames, ", "), deadline, pollInterval, func() (bool, string) {
		l, said := c.leader(rest...)
		elected = l
		return l != nil && l != old, said
	})
	newLeader := time.Now()
	t.Logf("%s elected %s after the cut", elected.name, newLeader.Sub(cut).Round(time.Millisecond))
	// The majority works on: every agent admits claims under the new
	// leader while the old one is still cut off.
	for _, a := range c.agents {
		waitAdmitted(t, r, a, newLeader, "under the new leader while "+old.name+" is cut off")
		o, _ := r.firstAdmitted(a.node, newLeader)
		t.Logf("%s: admitted claims under the new leader, the first %s after the cut", a.node, o.answered.Sub(cut).Round(time.Millisecond))
	}
	checkPinned(t, pins, "while the old leader "+old.name+" is cut off")
	healed = time.Now()
	c.net.heal(old.name)
	c.waitLeader("the members to agree on a leader after the heal", c.members...)
	for _, a := range c.agents {
		waitAdmitted(t, r, a, healed, "after the heal")
	}
	seen = w.drain()
	w.cancel()
	for _, a := range c.agents {
		i := slices.IndexFunc(seen, func(ev aliveEvent) bool { return ev.node == a.node && ev.deleted && ev.at.Before(healed) })
		ref, ok := r.firstRefusal(a.node, cut)
		// Every agent reaches the majority: its renewals must find it.
		if i >= 0 {
			t.Errorf("%s: its lease expired on the server %s after the leader's cut, though it reaches the majority",
				a.node, seen[i].at.Sub(cut).Round(time.Millisecond))
		}
		if ok && ref.answered.Before(healed) {
			t.Logf("%s: first refusal %s after the leader's cut (%s)", a.node, ref.answered.Sub(cut).Round(time.Millisecond), ref.err)
		} else {
			t.Logf("%s: no refusal during the leader's cut", a.node)
		}
	}
	checkPinned(t, pins, "after "+old.name+" was healed")

	// The end: no overlap in the whole history, every claim released.
	for _, err := range r.end() {
		t.Error(err)
	}
	ok, conflicts, unavailable := r.counts()
	t.Logf("%d holdings of single-writer volumes; claims answered 200: %d, 409: %d, 503: %d", len(r.holdings), ok, conflicts, unavailable)
	for _, o := range overlaps(r.holdings) {
		t.Errorf("overlapping writers: %s", o)
	}
	for _, p := range pins {
		if _, err := p.host.cl.Release(ctx, p.vol, "app-"+p.host.node); err != nil {
			t.Errorf("release %s on %s: %v", p.vol, p.host.node, err)
		}
	}
	testbin.Eventually(t, "no claim left in etcd", deadline, pollInterval, func() (bool, string) {
		cs, err := c.claimsInEtcd(c.members[0])
		if err != nil {
			return false, err.Error()
		}
		return len(cs) == 0, strings.Join(cs, "\n")
	})
	for _, a := range c.agents {
		a.stop(t)
	}
}

// createVolume creates volume id (1 MiB, its access mode from its name)
// through: more than the claims it starts (one per 100 ms) while one
// is held up on a volume (by an etcd request in the partition, at most
// the agents' dial_timeout of 2 s).a.
func createVolume(t *testing.T, a *agent, id, plugin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err := a.cl.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: id, CapacityBytes: 1 << 20, VolumeSpec: runtime.VolumeSpec{
		Plugin: plugin, Capabilities: []runtime.Capability{{AccessMode: accessModeOf(id), AttachmentMode: "file-system"}}}})
	if err != nil {
		t.Fatalf("create volume %s through %s: %v", id, a.node, err)
	}
}

// waitAdmitted waits until a has admitted a claim sent after since.
func waitAdmitted(t *testing.T, r *run, a *agent, since time.Time, when string) {
	t.Helper()
	testbin.Eventually(t, a.node+" to admit a claim "+when, deadline, pollInterval, func() (bool, string) {
		_, ok := r.firstAdmitted(a.node, since)
		return ok, "none yet"
	})
}

// checkPinned checks every pinned claim: published on its host (as its
// agent says), its target in the mount table, its file readable and
// writable.
func checkPinned(t *testing.T, pins []*pinned, when string) {
	t.Helper()
	for _, p := range pins {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		v, err := p.host.cl.Volume(ctx, p.vol)
		cancel()
		if err != nil {
			t.Errorf("%s: volume %s on %s: %v", when, p.vol, p.host.node, err)
		} else if i := slices.IndexFunc(v.Claims, func(c runtime.Claim) bool { return c.Alloc == "app-"+p.host.node }); i < 0 || v.Claims[i].State != "published" {
			t.Errorf("%s: the claim of app-%s on %s is not published on its host: %+v", when, p.host.node, p.vol, v.Claims)
		}
		next, err := mountedFileWorks(p.target, p.content)
		if err != nil {
			t.Errorf("%s: the claim of %s on %s: %v", when, p.host.node, p.vol, err)
			continue
		}
		p.content = next
	}
}
