package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// defaultClaimTimeout is how long volume claim waits by default: long
// enough for a few retries at the 2-minute backoff cap.
const defaultClaimTimeout = 5 * time.Minute

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// claimWithProgress claims volume for req.Alloc, letting the agent wait up
// to wait for conflicting claims to go (0: no waiting), and waiting at most
// wait+timeout in all. With progress, it prints each step of the claim to
// e.stdout as the agent's events report them, and returns once the
// published event has been printed, so the steps come out whole and in
// order.
func claimWithProgress(ctx context.Context, e *env, cl *api.Client, volume string, req runtime.ClaimRequest, wait, timeout time.Duration, progress bool) (runtime.Claim, error) {
	timeout += wait
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	claim := func() (runtime.Claim, error) {
		if wait > 0 {
			return cl.ClaimWait(tctx, volume, req, wait)
		}
		return cl.Claim(tctx, volume, req)
	}
	timedOut := func(err error) error {
		if ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("the claim of alloc %q on volume %q was not published within %s; the agent goes on with it: "+
				"follow it with 'csiactor volume status %s', or give it up with 'csiactor volume release -alloc %s %s'",
				req.Alloc, volume, timeout, volume, req.Alloc, volume)
		}
		return err
	}
	if !progress {
		c, err := waitNotice(tctx, e, cl, volume, req.Alloc, claim)
		return c, timedOut(err)
	}

	// Events up to now are history: the steps of this claim come after
	// the newest of them. A claim that is published already makes no
	// events, so there is nothing to wait for then.
	past, err := cl.Events(tctx)
	if err != nil {
		return runtime.Claim{}, timedOut(err)
	}
	var since time.Time
	for _, ev := range past {
		if ev.Time.After(since) {
			since = ev.Time
		}
	}
	v, err := cl.Volume(tctx, volume)
	if err != nil {
		return runtime.Claim{}, timedOut(err)
	}
	expectEvents := true
	for _, c := range v.Claims {
		if c.Alloc == req.Alloc && c.State == runtime.ClaimPublished {
			expectEvents = false
		}
	}

	fctx, stopFollow := context.WithCancel(tctx)
	defer stopFollow()
	published := make(chan struct{})
	followed := make(chan error, 1)
	fmt.Fprintf(e.stdout, "Claiming volume %s for alloc %s (%s, %s/%s)\n", volume, req.Alloc, req.Mode, req.AccessMode, req.AttachmentMode)
	go func() {
		followed <- cl.FollowEvents(fctx, func(ev runtime.Event) error {
			if ev.Volume != volume || ev.Alloc != req.Alloc || !ev.Time.After(since) {
				return nil
			}
			switch ev.Type {
			case runtime.EventPluginWait:
				fmt.Fprintf(e.stderr, "csiactor: %s; waiting\n", ev.Message)
			case runtime.EventClaimStep, runtime.EventClaimRetrying, runtime.EventClaimRepaired:
				fmt.Fprintf(e.stdout, "  %s  %s\n", ev.Time.Local().Format(time.TimeOnly), ev.Message)
			case runtime.EventClaimPublished, runtime.EventClaimFailed:
				fmt.Fprintf(e.stdout, "  %s  %s\n", ev.Time.Local().Format(time.TimeOnly), ev.Message)
				close(published)
				return errStopFollow
			}
			return nil
		})
	}()
	c, err := claim()
	if err != nil || !expectEvents {
		stopFollow()
		<-followed
		return c, timedOut(err)
	}
	select {
	case <-published:
	case ferr := <-followed:
		// The stream ended before the published event (the agent went
		// away, or the event was dropped): the claim is done all the same.
		if !errors.Is(ferr, errStopFollow) && !errors.Is(ferr, context.Canceled) {
			fmt.Fprintf(e.stderr, "csiactor: the claim is published, but its events stopped: %s\n", ferr)
		}
		return c, nil
	case <-tctx.Done():
	}
	stopFollow()
	<-followed
	return c, nil
}

// errStopFollow ends a FollowEvents once the awaited event came.
var errStopFollow = errors.New("stop following")
