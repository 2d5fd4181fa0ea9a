package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// chaosSeedEnv names an environment variable holding the seed of
// TestCluster_HistoryWithKills, to replay a run; by default the seed is the
// clock, logged.
const chaosSeedEnv = "CSIACTOR_CHAOS_SEED"

// chaosDuration is how long TestCluster_HistoryWithKills at least makes
// claims and kills agents.
const chaosDuration = 20 * time.Second

// holding is a claim the test knows to be held on a host: from the moment
// the agent answered 200 to the claim (it was admitted in etcd before) to
// the moment the test first sent its release (the claim may end any time
// after: when the agent recorded the release, or, on a host that was
// killed, when the restarted agent did). Any moment in between, etcd held
// the claim, so two holdings that must not overlap and do are a violation
// whatever the timing of the processes. A claim whose answer was lost in a
// kill is a holding only if etcd shows it once the agent is back, from
// then on. A holding on a host that was fenced meanwhile ends when the
// fence was sent (see clipFenced).
type holding struct {
	host, vol, alloc, mode string
	from, to               time.Time
}

func (h holding) String() string {
	return fmt.Sprintf("%s %s on %s [%s, %s]", h.alloc, h.mode, h.host, h.from.Format("15:04:05.000000"), h.to.Format("15:04:05.000000"))
}

// history is what the workers of the test saw, guarded by mu.
type history struct {
	mu        sync.Mutex
	holdings  []holding
	conflicts int
	unavail   int
	uncertain int
	adopted   int
	// fences are when a fence of each host was sent.
	fences map[string][]time.Time
}

func (h *history) add(f func(h *history)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

// TestCluster_HistoryWithKills is a history checker: three agents, real
// processes on an embedded etcd, each with its own node plugin, make many
// concurrent write claims and releases (and, on the multi-node volumes,
// read claims) on two single-node-writer and two multi-node-single-writer
// volumes, while one agent after another is SIGKILLed and started again;
// half the time, once its lease expired, another agent fences it first.
// Every claim the test knows was held is recorded with its host and time
// interval (see holding); a killed agent's claims count as held until it
// is fenced, or back and they are released. The check: no two claims of a
// single-node-writer volume, and no two writers of a multi-node-single-
// writer volume, ever overlap, across hosts or on one.
func TestCluster_HistoryWithKills(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", chaosSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay the schedule with %s=%d)", seed, chaosSeedEnv, seed)

	srv := etcdtest.Start(t)
	c := newProcCluster(t, srv.Endpoint())
	var agents []*procAgent
	for i := 1; i <= 3; i++ {
		node := fmt.Sprintf("n%d", i)
		// The plugin runs in the test process and outlives every kill of
		// its agent, as a plugin process does.
		p, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-" + node})
		_ = p
		a := c.addAgent(node, fmt.Sprintf("  - id: plugin-%s\n    plugin: %s\n    type: monolith\n    socket: %s\n", node, testPlugin, strings.TrimPrefix(ep, "unix://")))
		a.start()
		t.Cleanup(a.checkLogs)
		agents = append(agents, a)
	}
	ctx := context.Background()
	vols := map[string]string{
		"snw-0": "single-node-writer", "snw-1": "single-node-writer",
		"mnsw-0": "multi-node-single-writer", "mnsw-1": "multi-node-single-writer",
	}
	volIDs := slices.Sorted(func(yield func(string) bool) {
		for id := range vols {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range volIDs {
		if _, err := agents[0].mustClient().RegisterVolume(ctx, id, volSpec(id, vols[id])); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range agents {
		for _, id := range volIDs {
			eventually(t, "volume "+id+" on "+a.node, func() (bool, error) {
				_, err := a.mustClient().Volume(ctx, id)
				if errors.Is(err, runtime.ErrNotFound) {
					return false, nil
				}
				return err == nil, err
			})
		}
	}

	hist := &history{fences: map[string][]time.Time{}}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// workCtx outlives runCtx: a worker holding a claim when the run ends
	// still releases it, waiting for its agent to come back.
	workCtx, stopWork := context.WithTimeout(ctx, chaosDuration+5*procDeadline)
	defer stopWork()
	const workersPerHost = 4
	var wg sync.WaitGroup
	errc := make(chan error, 3*workersPerHost)
	for hi, a := range agents {
		for w := range workersPerHost {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(hi*workersPerHost+w+1)))
				peer := agents[(hi+1)%len(agents)]
				if err := claimWorker(runCtx, workCtx, a, peer, w, rng, volIDs, vols, hist); err != nil {
					errc <- err
				}
			}()
		}
	}

	// The chaos: now and then one agent is SIGKILLed, left down for up to
	// 3 s (beyond the 2 s lease, so its host goes down, or within it),
	// and started again; for chaosDuration, and at least minKills times.
	const minKills = 4
	rng := rand.New(rand.NewPCG(seed, 0))
	kills := 0
	for began := time.Now(); time.Since(began) < chaosDuration || kills < minKills; {
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		ai := rng.IntN(len(agents))
		a := agents[ai]
		downFor := time.Duration(200+rng.IntN(2800)) * time.Millisecond
		fence := rng.IntN(2) == 0 || (kills == minKills-1 && len(hist.fences) == 0)
		a.kill()
		kills++
		t.Logf("%s: SIGKILLed %s, down for %s", time.Now().Format("15:04:05.000"), a.node, downFor)
		if fence {
			fenceNode(t, agents[(ai+1)%len(agents)], a.node, hist)
		}
		time.Sleep(downFor)
		a.start()
	}
	stopRun()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}

	hist.mu.Lock()
	hs := clipFenced(hist.holdings, hist.fences)
	fences := 0
	for _, fs := range hist.fences {
		fences += len(fs)
	}
	conflicts, unavail, uncertain, adopted := hist.conflicts, hist.unavail, hist.uncertain, hist.adopted
	hist.mu.Unlock()
	writes := 0
	for _, h := range hs {
		if h.mode == "write" {
			writes++
		}
	}
	t.Logf("%d kills, %d fences; %d claims held (%d writes), %d refused with 409, %d with 503, %d answers lost in a kill (%d of them held, seen after the restart)",
		kills, fences, len(hs), writes, conflicts, unavail, uncertain, adopted)
	if writes < 30 || conflicts == 0 || fences == 0 {
		t.Errorf("the run exercised too little: %d kills, %d fences, %d writes held, %d conflicts", kills, fences, writes, conflicts)
	}
	for _, v := range checkHistory(hs, vols) {
		t.Errorf("overlap: %s", v)
	}

	// Every claim was released: etcd ends with none, and the agents stop
	// cleanly.
	eventually(t, "no claims left in the cluster", func() (bool, error) {
		ns, err := agents[0].mustClient().Nodes(ctx)
		if err != nil {
			return false, err
		}
		for _, n := range ns {
			if n.Claims != 0 || n.Status != runtime.NodeUp {
				return false, nil
			}
		}
		return len(ns) == 3, nil
	})
	for _, a := range agents {
		a.stop()
	}
}

// fenceNode waits until via sees node down, fences it through via and
// records when the fence was sent.
func fenceNode(t *testing.T, via *procAgent, node string, hist *history) {
	t.Helper()
	ctx := context.Background()
	testbin.Eventually(t, node+" down on "+via.node, procDeadline, 50*time.Millisecond, func() (bool, string) {
		n, err := via.mustClient().Node(ctx, node)
		return err == nil && n.Status == runtime.NodeDown, fmt.Sprintf("%+v %v", n, err)
	})
	sent := time.Now()
	hist.add(func(h *history) { h.fences[node] = append(h.fences[node], sent) })
	res, err := via.mustClient().FenceNode(ctx, node)
	if err != nil {
		t.Fatalf("fence %s through %s: %v", node, via.node, err)
	}
	t.Logf("%s: fenced %s through %s: %d claims", time.Now().Format("15:04:05.000"), node, via.node, len(res.Claims))
}

// clipFenced returns hs with each holding that a fence of its host
// interrupted ended at the fence: from then on the claim may be gone from
// etcd, and another host may take the volume.
func clipFenced(hs []holding, fences map[string][]time.Time) []holding {
	out := slices.Clone(hs)
	for i, h := range out {
		for _, f := range fences[h.host] {
			if f.After(h.from) && f.Before(out[i].to) {
				out[i].to = f
			}
		}
	}
	return out
}

// checkHistory returns the pairs of holdings that must not overlap and
// do: on a single-node-writer volume any two claims (it admits one claim
// in all), on a multi-node-single-writer volume any two writers.
func checkHistory(hs []holding, accessModes map[string]string) []string {
	byVol := map[string][]holding{}
	for _, h := range hs {
		if accessModes[h.vol] == "multi-node-single-writer" && h.mode != "write" {
			continue
		}
		byVol[h.vol] = append(byVol[h.vol], h)
	}
	var out []string
	for vol, vs := range byVol {
		sort.Slice(vs, func(i, j int) bool { return vs[i].from.Before(vs[j].from) })
		for i := range vs {
			for j := i + 1; j < len(vs) && vs[j].from.Before(vs[i].to); j++ {
				out = append(out, fmt.Sprintf("volume %s (%s): %s and %s", vol, accessModes[vol], vs[i], vs[j]))
			}
		}
	}
	return out
}

// claimWorker claims and releases until run ends, recording what it saw.
// A claim whose answer is lost (the agent was killed) is looked up once
// the agent is back: held (etcd has it: peer shows it), it is recorded
// from then and released.
func claimWorker(run, work context.Context, a, peer *procAgent, w int, rng *rand.Rand, volIDs []string, vols map[string]string, hist *history) error {
	for i := 0; run.Err() == nil; i++ {
		vol := volIDs[rng.IntN(len(volIDs))]
		am := vols[vol]
		mode := "write"
		if am == "multi-node-single-writer" && rng.IntN(3) == 0 {
			mode = "read"
		}
		alloc := fmt.Sprintf("%s-w%d-%d", a.node, w, i)
		cl := a.client(run)
		if cl == nil {
			return nil
		}
		// Under work, not run: a claim cut off when the run ends would
		// leave its outcome unknown.
		_, err := cl.Claim(work, vol, claimReq(alloc, mode, am))
		var from time.Time
		var apiErr *api.Error
		switch {
		case err == nil:
			from = time.Now()
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict:
			hist.add(func(h *history) { h.conflicts++ })
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			continue
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable:
			// The agent could not reach a decision (etcd or its plugin
			// unreachable for a moment): nothing was admitted.
			hist.add(func(h *history) { h.unavail++ })
			continue
		case errors.As(err, &apiErr):
			return fmt.Errorf("claim %s on %s via %s: %w", alloc, vol, a.node, err)
		default:
			// No answer: the agent died under the request. Whether the
			// claim was taken shows once it is back.
			hist.add(func(h *history) { h.uncertain++ })
			held, err := holds(work, a, peer, vol, alloc)
			if err != nil {
				return err
			}
			if !held {
				continue
			}
			from = time.Now()
			hist.add(func(h *history) { h.adopted++ })
		}
		// Held: keep it a moment, then release it.
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		to, err := release(work, a, vol, alloc)
		if err != nil {
			return err
		}
		hist.add(func(h *history) {
			h.holdings = append(h.holdings, holding{host: a.node, vol: vol, alloc: alloc, mode: mode, from: from, to: to})
		})
	}
	return nil
}

// holds reports whether etcd holds alloc's claim on vol for a's host, as
// peer shows it (a claim fenced while a was down is still on a's own
// record until a releases it), once a is up again.
func holds(ctx context.Context, a, peer *procAgent, vol, alloc string) (bool, error) {
	if a.client(ctx) == nil { // an agent killed under a request is marked down first: wait for its next run
		return false, ctx.Err()
	}
	for {
		cl := peer.client(ctx)
		if cl == nil {
			return false, ctx.Err()
		}
		v, err := cl.Volume(ctx, vol)
		var apiErr *api.Error
		switch {
		case err == nil:
			return slices.ContainsFunc(v.Claims, func(c runtime.Claim) bool { return c.Alloc == alloc && c.Host == a.node }), nil
		case errors.As(err, &apiErr):
			return false, fmt.Errorf("volume %s on %s: %w", vol, peer.node, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// release releases alloc's claim on vol through a, through every kill,
// until an agent answered; it returns when the first release was sent.
func release(ctx context.Context, a *procAgent, vol, alloc string) (time.Time, error) {
	var first time.Time
	for {
		cl := a.client(ctx)
		if cl == nil {
			return first, fmt.Errorf("release %s on %s via %s: %w", alloc, vol, a.node, ctx.Err())
		}
		if first.IsZero() {
			first = time.Now()
		}
		_, err := cl.Release(ctx, vol, alloc)
		var apiErr *api.Error
		switch {
		case err == nil:
			return first, nil
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound:
			// Released by the request whose answer was lost.
			return first, nil
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable:
			time.Sleep(50 * time.Millisecond)
			continue
		case errors.As(err, &apiErr):
			return first, fmt.Errorf("release %s on %s via %s: %w", alloc, vol, a.node, err)
		}
		time.Sleep(20 * time.Millisecond) // killed under the request: client waits for the next run
	}
}

// TestCheckHistory: the checker finds what it must and nothing else.
func TestCheckHistory(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	modes := map[string]string{"s": "single-node-writer", "m": "multi-node-single-writer"}
	tests := []struct {
		name string
		hs   []holding
		want int
	}{
		{"one after another", []holding{{"n1", "s", "a", "write", at(0), at(10)}, {"n2", "s", "b", "write", at(10), at(20)}}, 0},
		{"writers overlap across hosts", []holding{{"n1", "s", "a", "write", at(0), at(10)}, {"n2", "s", "b", "write", at(9), at(20)}}, 1},
		{"single-node-writer: a reader counts", []holding{{"n1", "s", "a", "read", at(0), at(10)}, {"n1", "s", "b", "write", at(5), at(20)}}, 1},
		{"multi-node: readers beside a writer", []holding{{"n1", "m", "a", "write", at(0), at(10)}, {"n2", "m", "b", "read", at(5), at(20)}, {"n3", "m", "c", "read", at(1), at(2)}}, 0},
		{"multi-node: two writers on one host", []holding{{"n1", "m", "a", "write", at(0), at(10)}, {"n1", "m", "b", "write", at(5), at(6)}}, 1},
		{"one held across others", []holding{{"n1", "s", "a", "write", at(0), at(100)}, {"n2", "s", "b", "write", at(10), at(20)}, {"n3", "s", "c", "write", at(30), at(40)}}, 2},
		{"other volumes apart", []holding{{"n1", "s", "a", "write", at(0), at(10)}, {"n2", "m", "b", "write", at(5), at(20)}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkHistory(tt.hs, modes); len(got) != tt.want {
				t.Fatalf("checkHistory = %q, want %d violations", got, tt.want)
			}
		})
	}
}

// TestClipFenced: a fence of a holding's host within the holding ends it
// there; a fence of another host, or outside the holding, does not.
func TestClipFenced(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	hs := []holding{
		{"n1", "s", "a", "write", at(0), at(100)},
		{"n1", "s", "b", "write", at(200), at(300)},
		{"n2", "s", "c", "write", at(0), at(100)},
	}
	got := clipFenced(hs, map[string][]time.Time{"n1": {at(50), at(150)}})
	want := []time.Time{at(50), at(300), at(100)}
	for i := range got {
		if !got[i].to.Equal(want[i]) || !got[i].from.Equal(hs[i].from) {
			t.Errorf("holding %d clipped to %s, want to %s", i, got[i], want[i].Format("15:04:05.000000"))
		}
	}
	if !hs[0].to.Equal(at(100)) {
		t.Error("clipFenced changed its input")
	}
}
