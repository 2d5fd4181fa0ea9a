package container

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/csiactor/csiactor/actors/plugin/proc"
)

// copyOutput copies the container's output, as the engine keeps it, to
// the output files in dir, an adopted container's from after the last
// line kept there: each line once, across agents and engine restarts. It ends when the container's
// output ends (it stopped) or ctx ends.
func (ct *Container) copyOutput(ctx context.Context, dir string) {
	defer ct.wg.Done()
	defer close(ct.copied)
	sink, err := proc.OpenSink(dir, ct.log)
	if err != nil {
		ct.log.WithError(err).Error("cannot keep the plugin container's output")
		return
	}
	defer func() { _ = sink.Close() }()
	// A container this agent started has kept nothing yet; an adopted one
	// goes on after the last line kept (by it, before the agent stopped).
	// Only the times of its own lines tell which of them are kept: a line
	// of a new container may have the time of its predecessor's last.
	var k kept
	if ct.adopted {
		k.last, k.atLast, err = lastKept(dir)
		if err != nil {
			ct.log.WithError(err).Warn("cannot read the plugin's kept output; copying the container's from its start")
		}
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		opts := client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Follow: true, Timestamps: true}
		if !k.last.IsZero() {
			opts.Since = fmt.Sprintf("%d.%09d", k.last.Unix(), k.last.Nanosecond())
		}
		k.skip = k.atLast
		r, err := ct.c.ContainerLogs(ctx, ct.id, opts)
		if err == nil {
			out := &lineWriter{stream: proc.Stdout, fn: func(l proc.Line) { ct.keep(sink, &k, l) }}
			errw := &lineWriter{stream: proc.Stderr, fn: out.fn}
			_, err = stdcopy.StdCopy(out, errw, r)
			_ = r.Close()
			out.flush()
			errw.flush()
			if err == nil {
				return // the output ended: the container stopped
			}
		}
		if ctx.Err() != nil {
			return
		}
		ct.log.WithError(err).WithField("container", short(ct.id)).Debug("copying the container's output broke off; retrying")
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// kept is how far the output is kept: the time of the last line kept and
// how many lines kept have that time. The engines' times are not unique:
// Podman's Docker-compatible API stamps lines to the second, and even
// its own log gives two lines the same nanosecond.
type kept struct {
	last   time.Time
	atLast int
	// skip is how many lines stamped last the engine sends again (its
	// "since" is inclusive): the first atLast of them, once per request.
	skip int
}

// keep writes l unless it is kept already: stamped before k.last, or one
// of the lines stamped k.last that the engine sends again.
func (ct *Container) keep(sink *proc.Sink, k *kept, l proc.Line) {
	switch {
	case l.Time.Before(k.last):
		return
	case l.Time.Equal(k.last) && k.skip > 0:
		k.skip--
		return
	case l.Time.Equal(k.last):
		k.atLast++
	default:
		k.last, k.atLast, k.skip = l.Time, 1, 0
	}
	if err := sink.Write(l); err != nil {
		ct.log.WithError(err).Warn("cannot keep a line of the plugin container's output")
	}
}

// lastKeptScan bounds how many of the last kept lines lastKept reads to
// count those stamped as the last one.
const lastKeptScan = 1000

// lastKept returns the time of the last line kept in dir (zero if there
// is none) and how many of the last lastKeptScan kept lines have it.
func lastKept(dir string) (time.Time, int, error) {
	lines, err := proc.ReadOutput(dir, lastKeptScan)
	if err != nil || len(lines) == 0 {
		return time.Time{}, 0, err
	}
	last := lines[len(lines)-1].Time
	n := 0
	for _, l := range lines {
		if l.Time.Equal(last) {
			n++
		}
	}
	return last, n, nil
}

// lineWriter splits what the engine sends for one stream into lines, each
// "<RFC 3339 time> <text>", and passes them to fn.
type lineWriter struct {
	stream string
	buf    []byte
	fn     func(proc.Line)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = nil
	}
}

func (w *lineWriter) line(b []byte) {
	ts, text, _ := bytes.Cut(b, []byte{' '})
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		t, text = time.Now(), b
	}
	w.fn(proc.Line{Time: t, Stream: w.stream, Text: string(text)})
}
