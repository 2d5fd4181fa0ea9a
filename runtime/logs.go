package runtime

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
)

// LogLine is one line an exec-managed plugin wrote to its stdout or
// stderr, as kept in <data_dir>/plugins/<alloc>/output.log (and its
// rotated files .1, .2, .3, each at most 10 MiB).
type LogLine struct {
	// Time is when the line was read from the plugin.
	Time time.Time `json:"time"`
	// Stream is "stdout" or "stderr".
	Stream string `json:"stream"`
	// Line is the text, without its newline. A line longer than 64 KiB
	// comes as several LogLines.
	Line string `json:"line"`
}

// LogsQuery says which lines AllocationLogs gives.
type LogsQuery struct {
	// Tail is how many of the last kept lines to give first; negative
	// means every kept line.
	Tail int
	// Follow keeps giving new lines as the plugin writes them, until the
	// context ends, the allocation is deregistered or the runtime shuts
	// down.
	Follow bool
}

// AllocationLogs calls fn with the output of the exec-managed allocation
// id, oldest line first, as q says. The output is kept by a log shim that
// runs beside the plugin, so it has every line, including those written
// while no agent ran. It fails with ErrNotFound for an unknown allocation
// and for an attached one (its plugin runs outside the agent, which has
// none of its output), and returns fn's error if fn fails.
func (r *Runtime) AllocationLogs(ctx context.Context, id string, q LogsQuery, fn func(LogLine) error) error {
	if err := ValidateID("id", id); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	a, err := r.registry.Allocation(ctx, id)
	if err != nil {
		return mapErr(err)
	}
	if len(a.Command) == 0 && a.Image == "" {
		return &kindError{kind: ErrNotFound, err: fmt.Errorf("allocation %q has no logs: it is attached (socket %s), so its plugin runs outside the agent", id, a.Socket)}
	}
	dir := filepath.Dir(plugin.SocketPath(r.cfg.DataDir, id))
	conv := func(l proc.Line) error { return fn(LogLine{Time: l.Time, Stream: l.Stream, Line: l.Text}) }
	if !q.Follow {
		lines, err := proc.ReadOutput(dir, q.Tail)
		if err != nil {
			return err
		}
		for _, l := range lines {
			if err := conv(l); err != nil {
				return err
			}
		}
		return nil
	}
	// The follow ends with the runtime too.
	var wg sync.WaitGroup
	defer wg.Wait()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-r.done:
			cancel()
		case <-fctx.Done():
		}
	}()
	return proc.FollowOutput(fctx, dir, q.Tail, conv)
}
