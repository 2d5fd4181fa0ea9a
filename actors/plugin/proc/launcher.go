package proc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Spec says how to start one process.
type Spec struct {
	// Command is the program and its arguments; Command[0] is looked up
	// in PATH when it has no slash.
	Command []string
	// Env is the complete environment, as "KEY=value" strings.
	Env []string
	// Dir is the working directory; empty means the agent's.
	Dir string
	// Log receives every line the process writes to stdout or stderr
	// (field "stream"). Nil discards the output.
	Log *logrus.Entry
}

type startReq struct {
	spec  Spec
	reply chan startResult
}

type startResult struct {
	p   *Process
	err error
}

// Launcher starts processes from one goroutine locked to one OS thread, so
// that Pdeathsig (which the kernel ties to the thread that forked) fires
// only when the agent process dies. It is safe for concurrent use.
type Launcher struct {
	reqs      chan startReq
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewLauncher starts a launcher. Close it when no more processes will be
// started; processes already started are not affected by Close.
func NewLauncher() *Launcher {
	l := &Launcher{
		reqs: make(chan startReq),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go l.run()
	return l
}

func (l *Launcher) run() {
	runtime.LockOSThread()
	// Unlock before returning: a goroutine that exits while locked takes
	// its thread down with it, and that would fire Pdeathsig on every
	// process started here. Unlocked, the runtime keeps the thread.
	defer close(l.done)
	defer runtime.UnlockOSThread()
	for {
		select {
		case r := <-l.reqs:
			p, err := start(r.spec)
			r.reply <- startResult{p, err}
		case <-l.quit:
			return
		}
	}
}

// Close stops the launcher goroutine and waits for it. It is idempotent.
func (l *Launcher) Close() {
	l.closeOnce.Do(func() { close(l.quit) })
	<-l.done
}

// Start starts a process as spec says. The process runs in its own process
// group and is killed by the kernel if the agent dies. The caller owns the
// returned Process and must eventually call Stop or Wait on it.
func (l *Launcher) Start(ctx context.Context, spec Spec) (*Process, error) {
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return nil, fmt.Errorf("%w: command is empty", ErrInvalidSpec)
	}
	r := startReq{spec: spec, reply: make(chan startResult, 1)}
	select {
	case l.reqs <- r:
	case <-l.quit:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("start process: %w", ctx.Err())
	}
	res := <-r.reply // start itself does not block for long
	return res.p, res.err
}

// drainTimeout bounds how long output is read after the process group is
// gone; a descendant that escaped the group may hold the pipe open.
const drainTimeout = 2 * time.Second

// start runs on the launcher's locked thread.
func start(spec Spec) (*Process, error) {
	log := spec.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start process: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return nil, fmt.Errorf("start process: stderr pipe: %w", err)
	}
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = spec.Dir
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	// The child has its own copies of the write ends; close ours so that
	// the readers see EOF when the child side is gone.
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return nil, fmt.Errorf("start process %q: %w", spec.Command[0], err)
	}
	p := &Process{
		pid:      cmd.Process.Pid,
		started:  time.Now(),
		cmd:      cmd,
		exited:   make(chan struct{}),
		finished: make(chan struct{}),
	}
	// Not reaped yet, so /proc/<pid>/stat exists even if it already exited.
	if st, err := ReadStat(p.pid); err == nil {
		p.startTicks = st.StartTicks
	}
	p.readers.Add(2)
	go p.read(outR, log.WithField("stream", "stdout"))
	go p.read(errR, log.WithField("stream", "stderr"))
	go p.wait(outR, errR)
	return p, nil
}

// Process is a running (or exited) process started by a Launcher.
type Process struct {
	pid        int
	startTicks uint64
	started    time.Time
	cmd        *exec.Cmd

	exited   chan struct{} // closed when the process is reaped
	finished chan struct{} // closed when the output readers are done too
	readers  sync.WaitGroup

	// Written before exited is closed, read only after.
	state   *os.ProcessState
	waitErr error
}

// PID returns the process ID.
func (p *Process) PID() int { return p.pid }

// StartTicks returns the start time from /proc/<pid>/stat, in clock ticks
// after boot (0 if it could not be read).
func (p *Process) StartTicks() uint64 { return p.startTicks }

// Started returns when the process was started.
func (p *Process) Started() time.Time { return p.started }

// Exited is closed when the process has exited and has been reaped. By
// then the rest of its process group has been sent SIGKILL.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Status describes how the process ended, like "exit status 1" or
// "signal: killed"; "running" before it ended.
func (p *Process) Status() string {
	select {
	case <-p.exited:
	default:
		return "running"
	}
	if p.state != nil {
		return p.state.String()
	}
	if p.waitErr != nil {
		return "wait failed: " + p.waitErr.Error()
	}
	return "exited"
}

// Success reports whether the process exited with status 0. It is false
// while it runs.
func (p *Process) Success() bool {
	select {
	case <-p.exited:
		return p.state != nil && p.state.Success()
	default:
		return false
	}
}

// Wait blocks until the process has exited and its output is read, or ctx
// ends.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for process %d: %w", p.pid, ctx.Err())
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL when the process
// has not exited after grace (or at once when ctx ends), and waits for the
// process and its output readers. It is safe to call more than once and
// after the process exited on its own.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.exited:
	default:
		p.signalGroup(syscall.SIGTERM)
		t := time.NewTimer(grace)
		select {
		case <-p.exited:
		case <-t.C:
			p.signalGroup(syscall.SIGKILL)
		case <-ctx.Done():
			p.signalGroup(syscall.SIGKILL)
		}
		t.Stop()
		// After SIGKILL the exit comes at once, unless the process is stuck
		// in the kernel (uninterruptible I/O); then give up with ctx.
		select {
		case <-p.exited:
		case <-ctx.Done():
			select {
			case <-p.exited:
			case <-time.After(time.Second):
				return fmt.Errorf("%w: pid %d after SIGKILL", ErrNotExited, p.pid)
			}
		}
	}
	<-p.finished
	return nil
}

// Kill sends SIGKILL to the process group without waiting.
func (p *Process) Kill() { p.signalGroup(syscall.SIGKILL) }

// signalGroup signals the whole process group. Only while the leader is
// not reaped: then its PID, which is the group ID, cannot be reused.
func (p *Process) signalGroup(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.pid, sig)
}

// wait waits for the exit without reaping, kills what is left of the
// group while its ID is still reserved, reaps, then drains the output.
func (p *Process) wait(outR, errR *os.File) {
	defer close(p.finished)
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.waitErr = p.cmd.Wait()
	p.state = p.cmd.ProcessState
	close(p.exited)

	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	t := time.NewTimer(drainTimeout)
	select {
	case <-drained:
	case <-t.C:
		// A descendant outside the group holds the pipe: stop reading.
		_ = outR.Close()
		_ = errR.Close()
		<-drained
	}
	t.Stop()
	_ = outR.Close()
	_ = errR.Close()
}

// maxLine is the longest output line logged whole; longer lines are cut.
const maxLine = 64 << 10

func (p *Process) read(r *os.File, log *logrus.Entry) {
	defer p.readers.Done()
	br := bufio.NewReaderSize(r, 4096)
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			logLine(log, line)
		}
		if err != nil {
			return
		}
	}
}

// logLine writes one line of a plugin's output. A JSON object with a "msg"
// (or "message") field, as logrus, slog and zap write, is logged at its
// "level" with its other fields prefixed "plugin." (so they cannot replace
// the agent's own fields such as alloc); anything else is logged as it is,
// at info.
func logLine(log *logrus.Entry, line string) {
	if len(line) < 2 || line[0] != '{' {
		log.Info(line)
		return
	}
	var obj map[string]any
	if json.Unmarshal([]byte(line), &obj) != nil {
		log.Info(line)
		return
	}
	msg, ok := obj["msg"].(string)
	if !ok {
		if msg, ok = obj["message"].(string); !ok {
			log.Info(line)
			return
		}
	}
	level := logrus.InfoLevel
	if s, ok := obj["level"].(string); ok {
		if l, err := logrus.ParseLevel(strings.ToLower(s)); err == nil {
			level = l
		}
	}
	if level < logrus.ErrorLevel {
		level = logrus.ErrorLevel // a plugin never stops the agent with fatal or panic
	}
	fields := make(logrus.Fields, len(obj))
	for k, v := range obj {
		switch k {
		case "msg", "message", "level", "time", "ts":
			continue
		}
		fields["plugin."+k] = v
	}
	log.WithFields(fields).Log(level, msg)
}

// readLine returns the next line without its newline, cut at maxLine.
func readLine(br *bufio.Reader) (string, error) {
	var buf []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if len(buf) < maxLine {
			buf = append(buf, chunk[:min(len(chunk), maxLine-len(buf))]...)
		}
		if err != nil || !isPrefix {
			return string(buf), err
		}
	}
}
