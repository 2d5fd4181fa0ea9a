package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Spec says how to start one plugin process.
type Spec struct {
	// Command is the program and its arguments; Command[0] is looked up
	// in PATH when it has no slash.
	Command []string
	// Env is the complete environment, as "KEY=value" strings.
	Env []string
	// Dir is the working directory; empty means the agent's.
	Dir string
	// OutputDir receives the process's stdout and stderr, in rotated
	// files (see OutputFile), written by the log shim. Required; it is
	// created (mode 0700) if missing.
	OutputDir string
	// MaxOutputSize and MaxOutputFiles bound the output files; zero means
	// DefaultMaxOutputSize and DefaultMaxOutputFiles.
	MaxOutputSize  int64
	MaxOutputFiles int
	// Log receives every line the process writes, as the log shim writes
	// it to the output file (field "stream"). Nil discards them.
	Log *logrus.Entry
}

// Launcher starts plugin processes, each with its log shim. It is safe
// for concurrent use.
type Launcher struct {
	closed atomic.Bool
}

// NewLauncher returns a launcher. Close it when no more processes will be
// started; processes already started are not affected by Close.
func NewLauncher() *Launcher { return &Launcher{} }

// Close makes later Starts fail with ErrClosed. It is idempotent.
func (l *Launcher) Close() { l.closed.Store(true) }

// Start starts the log shim, then the process as spec says, each in its
// own session (so that neither a terminal's signals nor the agent's exit
// reach them), the process's stdout and stderr piped to the shim. The
// caller owns the returned Process and must eventually call Stop, Wait or
// Detach on it.
func (l *Launcher) Start(ctx context.Context, spec Spec) (*Process, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return nil, fmt.Errorf("%w: command is empty", ErrInvalidSpec)
	}
	if spec.OutputDir == "" {
		return nil, fmt.Errorf("%w: output dir is required", ErrInvalidSpec)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start process: %w", err)
	}
	if err := os.MkdirAll(spec.OutputDir, 0o700); err != nil {
		return nil, fmt.Errorf("start process: output dir: %w", err)
	}
	return start(spec)
}

func start(spec Spec) (_ *Process, err error) {
	var pipes []*os.File
	closeAll := func() {
		for _, f := range pipes {
			_ = f.Close()
		}
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("start process: pipe: %w", err)
		}
		pipes = append(pipes, r, w)
	}
	outR, outW, errR, errW := pipes[0], pipes[1], pipes[2], pipes[3]

	p := newProcess(spec.OutputDir, spec.Log, false)
	defer func() {
		if err != nil {
			p.closeFDs()
		}
	}()
	// Before the shim can write anything of this run.
	p.followFrom()

	// The shim first: the reader exists before the plugin writes.
	shim := exec.Command("/proc/self/exe")
	shim.Args = shimCommand(spec.OutputDir, spec.MaxOutputSize, spec.MaxOutputFiles)
	shim.Env = []string{shimEnv + "=1", "GORACE=atexit_sleep_ms=0"}
	shim.ExtraFiles = []*os.File{outR, errR} // fds 3 and 4
	shim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := shim.Start(); err != nil {
		closeAll()
		return nil, fmt.Errorf("start log shim: %w", err)
	}
	_ = outR.Close()
	_ = errR.Close()
	if err := p.shim.child(shim); err != nil {
		_ = outW.Close()
		_ = errW.Close()
		_ = shim.Wait()
		return nil, fmt.Errorf("start log shim: %w", err)
	}

	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = spec.Dir
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	// The child has its own copies of the write ends; the shim sees EOF
	// when the child side is gone.
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = shim.Wait() // no writer left: the shim exits at once
		return nil, fmt.Errorf("start process %q: %w", spec.Command[0], err)
	}
	if err := p.plugin.child(cmd); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = shim.Wait()
		return nil, fmt.Errorf("start process %q: %w", spec.Command[0], err)
	}
	p.run()
	return p, nil
}

// Adopted says what Adopt takes over: the processes a previous agent
// started, as recorded in their State, and where their output goes.
type Adopted struct {
	State     State
	OutputDir string
	// Log receives every line the process writes from now on (field
	// "stream"). Nil discards them.
	Log *logrus.Entry
}

// Adopt takes over a plugin process and its log shim that a previous run
// of the agent started: both must run with the PIDs and start times of
// a.State. They are not children of this agent: their exit is seen
// through pidfds, and the plugin's exit status is unknown. The error
// wraps ErrNotAdopted when either is gone (or its PID is another
// process's now); the caller then stops what is left (KillLeftover) and
// starts the plugin anew.
func Adopt(a Adopted) (*Process, error) {
	st := a.State
	if st.PID <= 0 || st.PIDStart == 0 {
		return nil, fmt.Errorf("%w: no process recorded", ErrNotAdopted)
	}
	p := newProcess(a.OutputDir, a.Log, true)
	if err := p.plugin.adopt(st.PID, st.PIDStart); err != nil {
		p.closeFDs()
		return nil, fmt.Errorf("%w: plugin process %d: %w", ErrNotAdopted, st.PID, err)
	}
	if err := p.shim.adopt(st.ShimPID, st.ShimPIDStart); err != nil {
		p.closeFDs()
		return nil, fmt.Errorf("%w: log shim %d of plugin process %d: %w", ErrNotAdopted, st.ShimPID, st.PID, err)
	}
	p.followFrom()
	p.run()
	return p, nil
}

// followFrom sets where the forwarder begins: where the agent that last
// detached from a plugin of this directory stopped, if one did, so that
// what it left unlogged (of the plugin adopted now, or of one that ended
// while no agent ran) is logged now, and once; else at the end of the
// output kept so far.
func (p *Process) followFrom() {
	pos, ok, err := takePosition(p.dir)
	if err != nil {
		p.log.WithError(err).Warn("cannot go on logging the plugin's output where the previous agent stopped")
	}
	if ok {
		p.fwd.resume(pos)
	} else {
		p.fwd.openAtEnd()
	}
}

// member is one process of a Process: the plugin or its shim.
type member struct {
	pid   int
	start uint64
	cmd   *exec.Cmd // nil when adopted
	pidfd int
}

var errGone = errors.New("not running")

// child records a process this agent started and has not reaped.
func (m *member) child(cmd *exec.Cmd) error {
	m.cmd, m.pid = cmd, cmd.Process.Pid
	// Not reaped yet, so the PID is still this process's.
	fd, err := unix.PidfdOpen(m.pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	m.pidfd = fd
	if st, err := ReadStat(m.pid); err == nil {
		m.start = st.StartTicks
	}
	return nil
}

// adopt records a process that another agent started, if it runs with
// that start time.
func (m *member) adopt(pid int, start uint64) error {
	if pid <= 0 || start == 0 {
		return errGone
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return errGone
		}
		return fmt.Errorf("pidfd_open: %w", err)
	}
	// Checked after the pidfd is open: the pidfd holds on to whatever
	// process had the PID then, so a match means it is the one recorded.
	st, err := ReadStat(pid)
	if err != nil || st.StartTicks != start || st.State == "Z" {
		_ = unix.Close(fd)
		if err != nil && !errors.Is(err, ErrNoProcess) {
			return err
		}
		return errGone
	}
	m.pid, m.start, m.pidfd = pid, start, fd
	return nil
}

// Process is a running (or exited) plugin process with its log shim,
// started by a Launcher or adopted.
type Process struct {
	plugin, shim member
	adopted      bool
	started      time.Time
	dir          string
	log          *logrus.Entry
	fwd          *follower

	// mu guards the file descriptors (the pidfds and cancelFD) against
	// being closed, and their numbers reused, while they are signaled
	// or written.
	mu         sync.Mutex
	cancelFD   int // eventfd: written by Detach to end the waits
	detachOnce sync.Once
	exited     chan struct{} // closed when the plugin process is gone (reaped when ours)
	finished   chan struct{} // closed when the shim is gone too and the output forwarded
	done       chan struct{} // closed when the watcher goroutine ended

	// Written before exited is closed, read only after.
	status  string
	success bool
}

func newProcess(dir string, log *logrus.Entry, adopted bool) *Process {
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	return &Process{
		plugin: member{pidfd: -1}, shim: member{pidfd: -1},
		adopted: adopted, started: time.Now(), dir: dir, log: log,
		fwd:      &follower{dir: dir},
		cancelFD: efd,
		exited:   make(chan struct{}),
		finished: make(chan struct{}),
		done:     make(chan struct{}),
	}
}

func (p *Process) closeFDs() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fd := range []int{p.plugin.pidfd, p.shim.pidfd, p.cancelFD} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	p.plugin.pidfd, p.shim.pidfd, p.cancelFD = -1, -1, -1
	p.fwd.close()
}

// PID returns the plugin's process ID.
func (p *Process) PID() int { return p.plugin.pid }

// StartTicks returns the plugin's start time from /proc/<pid>/stat, in
// clock ticks after boot (0 if it could not be read).
func (p *Process) StartTicks() uint64 { return p.plugin.start }

// State identifies the plugin process and its shim, for WriteState.
func (p *Process) State() State {
	return State{PID: p.plugin.pid, PIDStart: p.plugin.start, ShimPID: p.shim.pid, ShimPIDStart: p.shim.start}
}

// Adopted reports whether the process was adopted rather than started.
func (p *Process) Adopted() bool { return p.adopted }

// Started returns when the process was started, or adopted.
func (p *Process) Started() time.Time { return p.started }

// Exited is closed when the plugin process has exited (and has been
// reaped, when this agent started it). By then the rest of its process
// group has been sent SIGKILL.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Status describes how the process ended, like "exit status 1" or
// "signal: killed" ("unknown status (adopted process)" for an adopted
// process, whose status only its parent learns); "running" before it
// ended.
func (p *Process) Status() string {
	select {
	case <-p.exited:
		return p.status
	default:
		return "running"
	}
}

// Success reports whether the process exited with status 0. It is false
// while it runs, and for an adopted process.
func (p *Process) Success() bool {
	select {
	case <-p.exited:
		return p.success
	default:
		return false
	}
}

// Wait blocks until the process has exited, its shim is gone and its
// output is forwarded, or ctx ends.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for process %d: %w", p.plugin.pid, ctx.Err())
	}
}

// Stop sends one SIGTERM to the process, then SIGKILL to its process
// group when the process has not exited after grace (or at once when ctx ends), and waits for the
// process, its shim and its output. It is safe to call more than once and
// after the process exited on its own; after Detach it does nothing.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.exited:
	case <-p.done:
		return nil // detached
	default:
		p.signalPlugin(syscall.SIGTERM)
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
				return fmt.Errorf("%w: pid %d after SIGKILL", ErrNotExited, p.plugin.pid)
			}
		}
	}
	<-p.finished
	return nil
}

// Kill sends SIGKILL to the process group without waiting.
func (p *Process) Kill() { p.signalGroup(syscall.SIGKILL) }

// Detach stops watching the process and forwarding its output, and leaves
// it and its shim running, for the next agent to adopt. It returns when
// the watcher has ended, every line the shim had written to the output
// file by then is forwarded, and how far that is recorded in the output
// directory (PositionFile): the next Adopt or Start there forwards the
// lines written after, so that across agents each line is logged once.
// Exited and Wait never finish after Detach unless the process had exited
// already.
func (p *Process) Detach() {
	p.detachOnce.Do(func() {
		var one [8]byte
		one[0] = 1 // eventfd counters are host-endian; 1 in any byte is non-zero
		p.mu.Lock()
		if p.cancelFD >= 0 {
			_, _ = unix.Write(p.cancelFD, one[:])
		}
		p.mu.Unlock()
	})
	<-p.done
}

// signalPlugin sends sig to the plugin alone (through its pidfd). A
// graceful stop uses it: the plugin is the group's leader, so signalling
// the group too would deliver the signal twice, and drivers that take a
// second SIGTERM as "exit now" would skip their graceful stop. The rest of
// the group gets SIGKILL once the plugin has exited (see run).
func (p *Process) signalPlugin(sig syscall.Signal) { p.signal(sig, false) }

// signalGroup signals the plugin and its process group. Only SIGKILL goes
// to the group: a signal that can be caught would reach the plugin twice.
func (p *Process) signalGroup(sig syscall.Signal) { p.signal(sig, true) }

// signal sends sig to the plugin (and with group, to its process group),
// only while the plugin has not been seen to exit: until then its PID,
// which is the group's ID, is not reused.
func (p *Process) signal(sig syscall.Signal, group bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	if p.plugin.pidfd < 0 {
		return
	}
	_ = unix.PidfdSendSignal(p.plugin.pidfd, sig, nil, 0)
	if group {
		_ = syscall.Kill(-p.plugin.pid, sig)
	}
}

// run starts the watcher and the output forwarder.
func (p *Process) run() {
	fwdStop := make(chan struct{}) // closed: drain and return
	fwdDone := make(chan struct{})
	go p.forward(fwdStop, fwdDone)
	go func() {
		defer close(p.done)
		defer p.closeFDs()
		if !p.await(&p.plugin, -1) { // detached
			close(fwdStop)
			<-fwdDone
			if err := writePosition(p.dir, p.fwd.position()); err != nil {
				p.log.WithError(err).Warn("the next agent will log only the plugin's lines written after it takes the plugin over")
			}
			return
		}
		_ = syscall.Kill(-p.plugin.pid, syscall.SIGKILL) // what is left of the group
		status, success := p.plugin.reap()
		p.mu.Lock()
		p.status, p.success = status, success
		close(p.exited)
		p.mu.Unlock()
		// The shim ends once every writer of the pipes is gone; a
		// descendant that left the group may hold them: then stop it.
		if !p.await(&p.shim, drainTimeout) {
			_ = unix.PidfdSendSignal(p.shim.pidfd, syscall.SIGKILL, nil, 0)
			p.await(&p.shim, -1)
		}
		p.shim.reap()
		close(fwdStop)
		<-fwdDone
		close(p.finished)
	}()
}

// drainTimeout bounds how long the shim may go on after the plugin's
// group is gone; a descendant that escaped the group may hold the pipes.
const drainTimeout = 2 * time.Second

// await waits until m has exited (true), Detach was called (false), or
// timeout passed (false; negative waits without a timeout). For a member
// that was never started (pidfd -1) it returns true at once.
func (p *Process) await(m *member, timeout time.Duration) bool {
	if m.pidfd < 0 {
		return true
	}
	ms := -1
	if timeout >= 0 {
		ms = int(timeout / time.Millisecond)
	}
	fds := []unix.PollFd{{Fd: int32(m.pidfd), Events: unix.POLLIN}, {Fd: int32(p.cancelFD), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false
		}
		switch {
		case n == 0:
			return false // timeout
		case fds[0].Revents != 0:
			return true
		case fds[1].Revents != 0 && ms < 0:
			return false // detached
		case fds[1].Revents != 0:
			// Detached while draining the shim: finish the drain anyway
			// (bounded), but stop polling the eventfd.
			fds = fds[:1]
		}
	}
}

// reap reaps a child and describes its end; an adopted process is reaped
// by its parent (init, usually), so its status is unknown.
func (m *member) reap() (status string, success bool) {
	if m.cmd == nil {
		return "unknown status (adopted process)", false
	}
	err := m.cmd.Wait()
	if st := m.cmd.ProcessState; st != nil {
		return st.String(), st.Success()
	}
	return "wait failed: " + err.Error(), false
}

// forward passes the output file's new lines to the log until stop is
// closed, then drains what is left and closes done.
func (p *Process) forward(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	logf := func(l Line) error {
		stream := l.Stream
		if stream == "" {
			stream = Stdout
		}
		logLine(p.log.WithField("stream", stream), l.Text)
		return nil
	}
	t := time.NewTicker(forwardInterval)
	defer t.Stop()
	for {
		_, _ = p.fwd.poll(logf)
		select {
		case <-stop:
			_, _ = p.fwd.poll(logf)
			return
		case <-t.C:
		}
	}
}
