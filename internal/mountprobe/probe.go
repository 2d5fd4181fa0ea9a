// Package mountprobe tells whether mounts answer: a mount can be in the
// mount table and still be dead (a FUSE mount whose server process died
// answers every access with ENOTCONN; a network mount whose server went
// away with EIO or ESTALE, or not at all).
//
// A probe is a stat of the mount point. A stat of a hung mount does not
// return, and holds an OS thread while it waits, so a Prober runs each stat
// on its own goroutine, waits for it no longer than its timeout (the mount
// is then broken: "timeout"), never starts a second stat on a path whose
// first has not returned, and keeps at most Budget stats outstanding at
// once: a path that finds no place within the timeout is reported unknown,
// not broken. A Probe of many paths therefore returns within two timeouts
// (one waiting for places, one for the last stats), whatever the mounts do.
package mountprobe

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Causes of a broken mount, as Probe reports them.
const (
	CauseENOTCONN = "ENOTCONN"
	CauseEIO      = "EIO"
	CauseESTALE   = "ESTALE"
	CauseTimeout  = "timeout"
)

// Defaults of a Prober.
const (
	DefaultTimeout = 5 * time.Second
	DefaultBudget  = 16
)

// Cause names the error of a stat that shows a dead mount: ENOTCONN, EIO
// or ESTALE; "" for any other error (or none).
func Cause(err error) string {
	switch {
	case errors.Is(err, syscall.ENOTCONN):
		return CauseENOTCONN
	case errors.Is(err, syscall.EIO):
		return CauseEIO
	case errors.Is(err, syscall.ESTALE):
		return CauseESTALE
	}
	return ""
}

// Prober probes mount points. The zero value is not usable: use New. It is
// safe for concurrent use.
type Prober struct {
	timeout time.Duration
	stat    func(string) error
	slots   chan struct{} // one token per stat outstanding

	mu      sync.Mutex
	pending map[string]struct{} // guarded by mu: paths whose stat has not returned
}

// Config says how a Prober probes; zero values mean the defaults.
type Config struct {
	// Timeout bounds how long a probe waits for its stat
	// (DefaultTimeout).
	Timeout time.Duration
	// Budget is how many stats may be outstanding at once (DefaultBudget).
	Budget int
	// Stat is the probe of one path (os.Stat's error when nil); tests
	// replace it.
	Stat func(path string) error
}

// New returns a Prober.
func New(cfg Config) *Prober {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Budget <= 0 {
		cfg.Budget = DefaultBudget
	}
	if cfg.Stat == nil {
		cfg.Stat = func(p string) error { _, err := os.Stat(p); return err }
	}
	return &Prober{timeout: cfg.Timeout, stat: cfg.Stat, slots: make(chan struct{}, cfg.Budget), pending: map[string]struct{}{}}
}

// Result is what Probe found of one path.
type Result struct {
	// Cause is "" when the mount answered (or failed in a way that does
	// not show a dead mount, such as ENOENT), else one of the Cause
	// constants.
	Cause string
	// Unknown is true when the path could not be probed: no place in the
	// budget of outstanding stats freed up within the timeout, or ctx
	// ended first.
	Unknown bool
}

// Broken reports whether the probe found the mount dead.
func (r Result) Broken() bool { return r.Cause != "" }

// Probe stats each path, in parallel up to the budget, and returns what it
// found of each. It returns within two timeouts (or when ctx ends),
// whatever the mounts do: a path that finds no place for its stat within
// one timeout of the call is Unknown, and each stat waits no longer than
// one timeout. A path whose earlier stat is still outstanding is
// CauseTimeout at once.
func (p *Prober) Probe(ctx context.Context, paths []string) map[string]Result {
	placeBy := time.Now().Add(p.timeout)
	seen := make(map[string]struct{}, len(paths))
	uniq := make([]string, 0, len(paths))
	for _, path := range paths {
		if _, dup := seen[path]; !dup {
			seen[path] = struct{}{}
			uniq = append(uniq, path)
		}
	}
	res := make([]Result, len(uniq))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(cap(p.slots), len(uniq)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res[i] = p.one(ctx, uniq[i], placeBy)
			}
		}()
	}
	for i := range uniq {
		next <- i
	}
	close(next)
	wg.Wait()
	out := make(map[string]Result, len(uniq))
	for i, path := range uniq {
		out[path] = res[i]
	}
	return out
}

// One probes one path (see Probe).
func (p *Prober) One(ctx context.Context, path string) Result {
	return p.one(ctx, path, time.Now().Add(p.timeout))
}

// one probes path, waiting for a place for its stat until placeBy.
func (p *Prober) one(ctx context.Context, path string, placeBy time.Time) Result {
	p.mu.Lock()
	if _, stuck := p.pending[path]; stuck {
		p.mu.Unlock()
		return Result{Cause: CauseTimeout}
	}
	p.mu.Unlock()
	t := time.NewTimer(time.Until(placeBy))
	defer t.Stop()
	// A place, waiting for one no longer than placeBy: places are taken
	// by stats that have not returned.
	select {
	case p.slots <- struct{}{}:
	case <-t.C:
		return Result{Unknown: true}
	case <-ctx.Done():
		return Result{Unknown: true}
	}
	p.mu.Lock()
	if _, stuck := p.pending[path]; stuck { // another probe of it started meanwhile
		p.mu.Unlock()
		<-p.slots
		return Result{Cause: CauseTimeout}
	}
	p.pending[path] = struct{}{}
	p.mu.Unlock()
	t.Reset(p.timeout) // the stat's own timeout (no stale tick since Go 1.23)
	done := make(chan error, 1)
	// This goroutine outlives the probe when the stat hangs: it ends
	// when the stat returns (a hung FUSE mount returns ENOTCONN once its
	// server is killed), and holds its slot and its path until then.
	go func() {
		err := p.stat(path)
		p.mu.Lock()
		delete(p.pending, path)
		p.mu.Unlock()
		<-p.slots
		done <- err
	}()
	select {
	case err := <-done:
		return Result{Cause: Cause(err)}
	case <-t.C:
		return Result{Cause: CauseTimeout}
	case <-ctx.Done():
		return Result{Unknown: true}
	}
}

// Outstanding returns how many stats have not returned yet.
func (p *Prober) Outstanding() int { return len(p.slots) }

// Unmount takes the mount at path away: a plain unmount, else a lazy one
// (MNT_DETACH), which a dead FUSE mount still in use needs. A path that is
// not a mount point (EINVAL) or is gone (ENOENT) is not an error.
func Unmount(path string) error {
	err := unix.Unmount(path, 0)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if derr := unix.Unmount(path, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
		return &os.PathError{Op: "unmount", Path: path, Err: derr}
	}
	return nil
}
