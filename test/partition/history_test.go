package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// holding is a claim the test knows was held on a host: from the moment
// the agent answered 200 (etcd had admitted it before) to the moment the
// test first sent its release (the claim ends in etcd some time after).
// Two holdings of a single-writer volume that overlap are two writers at
// once, whatever the timing of the processes.
type holding struct {
	host, vol, alloc string
	from, to         time.Time
}

func (h holding) String() string {
	return fmt.Sprintf("%s on %s [%s, %s]", h.alloc, h.host, h.from.Format("15:04:05.000000"), h.to.Format("15:04:05.000000"))
}

// outcome is the answer to one claim request.
type outcome struct {
	host, vol, alloc string
	sent, answered   time.Time
	status           int // 200, or the API error's status
	err              string
}

// run is the claims the workers and probers make, and what they saw.
type run struct {
	mu       sync.Mutex
	holdings []holding // guarded by mu
	outcomes []outcome // guarded by mu

	stop   context.CancelFunc // ends the loops
	finish context.CancelFunc // ends the releases still under way
	wg     sync.WaitGroup
	errs   chan error

	endOnce sync.Once
	endErrs []error
}

// startRun starts on each agent workers that claim and release the
// single-writer volumes vols[agent] for writing (holdings recorded), and
// a prober that claims one of the agent's probe volumes every 100 ms,
// each claim in its own goroutine, never two at once on one volume (a
// claim stuck on a volume holds up the next one there, not the prober).
func startRun(agents []*agent, vols map[string][]string, probes map[string][]string) *run {
	runCtx, stop := context.WithCancel(context.Background())
	workCtx, finish := context.WithCancel(context.Background())
	r := &run{stop: stop, finish: finish, errs: make(chan error, 100)}
	const workers = 2
	for hi, a := range agents {
		for w := range workers {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				rng := rand.New(rand.NewPCG(uint64(hi), uint64(w)))
				if err := r.worker(runCtx, workCtx, a, w, rng, vols[a.node]); err != nil {
					r.errs <- err
				}
			}()
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.prober(runCtx, workCtx, a, probes[a.node])
		}()
	}
	return r
}

// end stops the loops and waits for them; it returns their errors. It is
// idempotent.
func (r *run) end() []error {
	r.endOnce.Do(func() { r.endErrs = r.endLoops() })
	return r.endErrs
}

func (r *run) endLoops() []error {
	r.stop()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(deadline):
		r.finish()
		<-done
		return []error{fmt.Errorf("the workers did not finish their releases within %s", deadline)}
	}
	r.finish()
	close(r.errs)
	var out []error
	for err := range r.errs {
		out = append(out, err)
	}
	return out
}

// claim sends one claim for writing and records its outcome. The claim
// is sent under work, not run: one cut off when the run ends would leave
// its outcome unknown.
func (r *run) claim(work context.Context, a *agent, vol, alloc, accessMode string) (outcome, error) {
	o := outcome{host: a.node, vol: vol, alloc: alloc, sent: time.Now()}
	_, err := a.cl.Claim(work, vol, runtime.ClaimRequest{Alloc: alloc, Mode: runtime.ModeWrite, AccessMode: accessMode, AttachmentMode: "file-system"})
	o.answered = time.Now()
	var apiErr *api.Error
	switch {
	case err == nil:
		o.status = http.StatusOK
	case errors.As(err, &apiErr) && (apiErr.Status == http.StatusConflict || apiErr.Status == http.StatusServiceUnavailable):
		o.status, o.err = apiErr.Status, err.Error()
	default:
		return o, fmt.Errorf("claim %s on %s via %s: %w", alloc, vol, a.node, err)
	}
	r.mu.Lock()
	r.outcomes = append(r.outcomes, o)
	r.mu.Unlock()
	return o, nil
}

// release releases alloc's claim on vol through a, retrying while the
// agent answers 503; it returns when the first release was sent.
func release(ctx context.Context, a *agent, vol, alloc string) (time.Time, error) {
	first := time.Now()
	for {
		_, err := a.cl.Release(ctx, vol, alloc)
		var apiErr *api.Error
		switch {
		case err == nil, errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound:
			return first, nil
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable && ctx.Err() == nil:
			time.Sleep(50 * time.Millisecond)
		default:
			return first, fmt.Errorf("release %s on %s via %s: %w", alloc, vol, a.node, err)
		}
	}
}

// worker claims and releases vols (single-writer volumes) until run ends.
func (r *run) worker(run, work context.Context, a *agent, w int, rng *rand.Rand, vols []string) error {
	for i := 0; run.Err() == nil; i++ {
		vol := vols[rng.IntN(len(vols))]
		alloc := fmt.Sprintf("%s-w%d-%d", a.node, w, i)
		o, err := r.claim(work, a, vol, alloc, accessModeOf(vol))
		if err != nil {
			return err
		}
		if o.status != http.StatusOK {
			time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
			continue
		}
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		to, err := release(work, a, vol, alloc)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.holdings = append(r.holdings, holding{host: a.node, vol: vol, alloc: alloc, from: o.answered, to: to})
		r.mu.Unlock()
	}
	return nil
}

// prober claims (and at once releases) one of vols every 100 ms until run
// ends, skipping the volumes whose last claim is still under way.
func (r *run) prober(run, work context.Context, a *agent, vols []string) {
	busy := make([]atomic.Bool, len(vols))
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	next := 0
	for seq := 0; ; seq++ {
		select {
		case <-run.Done():
			return
		case <-t.C:
		}
		for range vols {
			i := next
			next = (next + 1) % len(vols)
			if !busy[i].CompareAndSwap(false, true) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer busy[i].Store(false)
				alloc := fmt.Sprintf("%s-p%d", a.node, seq)
				o, err := r.claim(work, a, vols[i], alloc, accessModeOf(vols[i]))
				if err == nil && o.status == http.StatusOK {
					_, err = release(work, a, vols[i], alloc)
				}
				if err != nil {
					r.errs <- err
				}
			}()
			break
		}
	}
}

// firstRefusal returns the first 503 host answered after since, if any.
func (r *run) firstRefusal(host string, since time.Time) (outcome, bool) {
	return r.first(func(o outcome) bool {
		return o.host == host && o.status == http.StatusServiceUnavailable && o.answered.After(since)
	})
}

// firstAdmitted returns the first claim host admitted that was sent after
// since, if any.
func (r *run) firstAdmitted(host string, since time.Time) (outcome, bool) {
	return r.first(func(o outcome) bool { return o.host == host && o.status == http.StatusOK && o.sent.After(since) })
}

func (r *run) first(match func(outcome) bool) (outcome, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first outcome
	for _, o := range r.outcomes {
		if match(o) && (first.answered.IsZero() || o.answered.Before(first.answered)) {
			first = o
		}
	}
	return first, !first.answered.IsZero()
}

// counts returns how many claims were answered 200, 409 and 503.
func (r *run) counts() (ok, conflict, unavailable int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.outcomes {
		switch o.status {
		case http.StatusOK:
			ok++
		case http.StatusConflict:
			conflict++
		case http.StatusServiceUnavailable:
			unavailable++
		}
	}
	return ok, conflict, unavailable
}

// overlaps returns the pairs of holdings of one volume that overlap: all
// the workers' volumes admit one writer at a time across the cluster.
func overlaps(hs []holding) []string {
	byVol := map[string][]holding{}
	for _, h := range hs {
		byVol[h.vol] = append(byVol[h.vol], h)
	}
	var out []string
	for vol, vs := range byVol {
		sort.Slice(vs, func(i, j int) bool { return vs[i].from.Before(vs[j].from) })
		for i := range vs {
			for j := i + 1; j < len(vs) && vs[j].from.Before(vs[i].to); j++ {
				out = append(out, fmt.Sprintf("volume %s: %s and %s", vol, vs[i], vs[j]))
			}
		}
	}
	sort.Strings(out)
	return out
}
