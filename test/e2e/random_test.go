package e2e

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
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// SeedEnv names an environment variable that sets the seed of
// TestAgent_RandomKills, to run a failing run's kills and claims again.
const SeedEnv = "CSIACTOR_E2E_SEED"

// The randomized crash test's size: about a minute of kills.
const (
	randomKills       = 40 // 0.3–2 s apart plus each restart: about a minute
	randomWorkers     = 4
	randomVolumes     = 10 // per driver, 4 single-node-writer, 6 multi-node-multi-writer
	randomMinGap      = 300 * time.Millisecond
	randomMaxGap      = 2 * time.Second
	randomCallTimeout = 20 * time.Second // one claim; then it is left to the agent
)

// TestAgent_RandomKills SIGKILLs the agent at random moments (randomKills
// times, randomMinGap to randomMaxGap after it and its plugins came up
// again) while
// randomWorkers workers, each an alloc of its own, claim and release
// volumes of every driver through the API, one agent running both drivers.
// Of each driver's volumes, 4 are single-node-writer and 6
// multi-node-multi-writer (claimed for writing or reading). A claim answered 409 (the access
// mode's limit, or the alloc's previous claim still being released) is
// fine; a claim or release cut off by the kill, or refused while the
// agent starts, is retried as a caller would. Any other answer is an
// error.
//
// After the last kill the agent is started again and must settle: every
// claim published or freed, the drivers' own bookkeeping and the mount
// table holding exactly what the claims own, no single-node-writer volume
// with more than one claim. Then every claim is released, and it must
// settle again with nothing left.
//
// The seed is logged; $CSIACTOR_E2E_SEED sets it. It fixes the kill
// moments and each worker's choices, not how they interleave.
func TestAgent_RandomKills(t *testing.T) {
	defer leakcheck.Check(t)()
	seed := randomSeed(t)
	h := newHost(t)
	ds := []driver{exampleDriver}
	if os.Getenv(hostpath.Env) != "" {
		ds = append(ds, hostpathDriver)
	} else {
		t.Logf("the hostpath driver is not available: set $%s to a build of it; running with the example plugin alone", hostpath.Env)
	}
	randomKillsRun(t, h, ds, seed, randomKills, func(_ int, _ *rand.Rand, a *agent) *agent { return h.killAgent(a, ds) })
}

// randomSeed is the seed of a randomized test: $CSIACTOR_E2E_SEED, else
// the time; it is logged.
func randomSeed(t *testing.T) int64 {
	t.Helper()
	seed := time.Now().UnixNano()
	if s := os.Getenv(SeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("$%s=%q: want an integer", SeedEnv, s)
		}
	}
	t.Logf("seed %d (run again with %s=%d)", seed, SeedEnv, seed)
	return seed
}

// killAgent SIGKILLs the agent a, starts the next one and waits until
// the plugins of ds are healthy again.
func (h *host) killAgent(a *agent, ds []driver) *agent {
	h.t.Helper()
	a.signal(syscall.SIGKILL)
	if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		h.t.Fatalf("agent ended with %s, want killed by SIGKILL", st)
	}
	a.checkNoRace()
	a = h.startAgent()
	for _, d := range ds {
		h.waitPluginHealthy(d)
	}
	return a
}

// randomKillsRun is the body of TestAgent_RandomKills on host h with the
// drivers ds: kills times, kill (given the kill's number, the kills' own
// random source and the running agent) kills something and waits until
// ds are healthy again, and returns the agent running then.
func randomKillsRun(t *testing.T, h *host, ds []driver, seed int64, kills int, kill func(k int, rng *rand.Rand, a *agent) *agent) {
	// Steps the restarted agent finds its plugins not yet healthy for
	// are retried sooner than elsewhere, so that claims and releases keep
	// going between kills.
	h.retryInitial, h.retryMax = "100ms", "1s"
	var cfg strings.Builder
	for _, d := range ds {
		cfg.WriteString(d.allocation(h))
	}
	h.writeConfig(cfg.String())
	a := h.startAgent()
	var vols []randomVolume
	for _, d := range ds {
		h.waitPluginHealthy(d)
		for i := range randomVolumes {
			v := randomVolume{id: fmt.Sprintf("%s-%d", d.alloc, i), access: "single-node-writer"}
			if i%5 >= 2 {
				v.access = "multi-node-multi-writer"
			}
			h.createVolume(d, v.id, v.access)
			vols = append(vols, v)
		}
	}

	c, err := api.NewClient(h.address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	tallies := make([]tally, randomWorkers)
	for i := range randomWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &randomWorker{c: c, alloc: fmt.Sprintf("w%d", i), vols: vols, stop: stop,
				rng: rand.New(rand.NewPCG(uint64(seed), uint64(i+1))), tally: &tallies[i]}
			w.run()
		}()
	}

	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	began := time.Now()
	for k := range kills {
		time.Sleep(randomMinGap + time.Duration(rng.Int64N(int64(randomMaxGap-randomMinGap)+1)))
		a = kill(k, rng, a)
	}
	close(stop)
	wg.Wait()
	restarted := time.Now()
	var sum tally
	for _, tl := range tallies {
		sum.add(tl)
	}
	t.Logf("%d kills in %s; %d workers made %d claims (%d answered 409, %d left to the agent after %s) and %d releases; %d calls retried while the agent was down or starting",
		kills, restarted.Sub(began).Round(time.Millisecond), randomWorkers, sum.claims, sum.conflicts, sum.pending, randomCallTimeout, sum.releases, sum.retries)
	for _, e := range sum.errors {
		t.Errorf("answered an error: %s", e)
	}

	settled := true
	for _, d := range ds {
		_, ok := h.settle(d, "after the last kill")
		settled = settled && ok
	}
	if !settled {
		t.FailNow()
	}
	t.Logf("settled %s after the last restart", time.Since(restarted).Round(time.Millisecond))
	for _, d := range ds {
		for _, v := range h.volumes(d) {
			for _, cl := range v.Claims {
				h.ok("volume", "release", "-alloc", cl.Alloc, v.ID)
			}
		}
	}
	for _, d := range ds {
		vols, _ := h.settle(d, "after releasing everything")
		for _, v := range vols {
			if len(v.Claims) > 0 {
				t.Errorf("after releasing everything: %s", describe(v))
			}
		}
	}
	a.stop()
}

// randomVolume is a volume of TestAgent_RandomKills and its one access
// mode.
type randomVolume struct{ id, access string }

// tally counts what one worker did.
type tally struct {
	claims, conflicts, pending, releases, retries int
	// errors are the answers that were neither success, 409 nor the
	// agent being down, each once with how often it came.
	errors []string
}

func (t *tally) add(o tally) {
	t.claims += o.claims
	t.conflicts += o.conflicts
	t.pending += o.pending
	t.releases += o.releases
	t.retries += o.retries
	t.errors = append(t.errors, o.errors...)
}

// randomWorker claims and releases volumes as one alloc until stop is
// closed, holding at most three at once.
type randomWorker struct {
	c     *api.Client
	alloc string
	vols  []randomVolume
	stop  <-chan struct{}
	rng   *rand.Rand
	tally *tally
	held  []randomVolume
	seen  map[string]int // error answers by text
}

func (w *randomWorker) run() {
	w.seen = map[string]int{}
	for !testbin.Closed(w.stop) {
		if len(w.held) > 0 && (len(w.held) >= 3 || w.rng.IntN(2) == 0) {
			i := w.rng.IntN(len(w.held))
			v := w.held[i]
			w.held = slices.Delete(w.held, i, i+1)
			w.release(v)
			continue
		}
		v := w.vols[w.rng.IntN(len(w.vols))]
		if slices.Contains(w.held, v) {
			continue
		}
		mode := runtime.ModeWrite
		if v.access == "multi-node-multi-writer" && w.rng.IntN(2) == 0 {
			mode = runtime.ModeRead
		}
		w.claim(v, mode)
	}
	var keys []string
	for k := range w.seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w.tally.errors = append(w.tally.errors, fmt.Sprintf("%dx %s", w.seen[k], k))
	}
}

// claim claims v until the agent answers; a claim the agent has not
// published within randomCallTimeout is left to it, and released later.
func (w *randomWorker) claim(v randomVolume, mode string) {
	req := runtime.ClaimRequest{Alloc: w.alloc, Mode: mode, AccessMode: v.access, AttachmentMode: "file-system"}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), randomCallTimeout)
		_, err := w.c.Claim(ctx, v.id, req)
		cancel()
		switch status(err) {
		case http.StatusOK:
			w.tally.claims++
			w.held = append(w.held, v)
			return
		case http.StatusConflict:
			w.tally.conflicts++
			time.Sleep(time.Duration(20+w.rng.IntN(30)) * time.Millisecond) // as a caller would back off
			return
		case http.StatusServiceUnavailable:
			w.tally.retries++
			time.Sleep(100 * time.Millisecond)
			continue
		case http.StatusGatewayTimeout:
			w.tally.pending++
			w.held = append(w.held, v)
			return
		default:
			w.seen[fmt.Sprintf("claim %s %s by %s: %d %v", v.id, mode, w.alloc, status(err), err)]++
			w.held = append(w.held, v) // it may exist: release it
			return
		}
	}
}

// release releases v until the agent answers; "holds no claim" (a claim
// that never was, or one released before the kill cut off the answer) is
// an answer.
func (w *randomWorker) release(v randomVolume) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), randomCallTimeout)
		_, err := w.c.Release(ctx, v.id, w.alloc)
		cancel()
		switch status(err) {
		case http.StatusOK, http.StatusNotFound:
			w.tally.releases++
			return
		case http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			w.tally.retries++
			time.Sleep(100 * time.Millisecond)
			continue
		default:
			w.seen[fmt.Sprintf("release %s by %s: %d %v", v.id, w.alloc, status(err), err)]++
			return
		}
	}
}

// status classifies an API call's outcome as an HTTP status: 200 for
// success, the agent's status for an answer, 503 for no answer (the
// agent is down or was killed while answering) and 504 when the call's
// own deadline passed.
func status(err error) int {
	var ae *api.Error
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &ae):
		return ae.Status
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	default:
		return http.StatusServiceUnavailable
	}
}
