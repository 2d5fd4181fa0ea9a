package registration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
)

// Defaults of Config.
const (
	DefaultCallTimeout    = 5 * time.Second
	DefaultRetryInitial   = 500 * time.Millisecond
	DefaultRetryMax       = 30 * time.Second
	DefaultRegisterTimout = 2 * time.Minute
)

// Registrar is where the watcher registers the drivers it finds: the
// agent's registry. Its methods are called from one goroutine, one at a
// time.
type Registrar interface {
	// Register makes d an attached node allocation of plugin d.Name with
	// socket d.Endpoint, or leaves it as it is when it already is
	// (idempotent), replacing one this directory registered earlier with
	// another endpoint. An error wrapping ErrRefused is final; others are
	// retried.
	Register(ctx context.Context, d Driver) error
	// Deregister removes the allocation of driver name that this
	// directory registered; one that is not there is not an error.
	Deregister(ctx context.Context, name string) error
	// Registered lists the names of the drivers registered from the
	// directory, by this run or an earlier one.
	Registered(ctx context.Context) ([]string, error)
}

// Config configures a Watcher. Zero values mean defaults.
type Config struct {
	// Dir is the registration directory (required): the kubelet's is
	// /var/lib/kubelet/plugins_registry.
	Dir string
	// Registrar registers and deregisters the drivers (required).
	Registrar Registrar
	// Log receives the watcher's log lines.
	Log *logrus.Entry
	// CallTimeout bounds each call to a registration socket (GetInfo,
	// NotifyRegistrationStatus).
	CallTimeout time.Duration
	// RegisterTimeout bounds each call to the Registrar.
	RegisterTimeout time.Duration
	// RetryInitial and RetryMax pace the retries of a registration socket
	// that does not answer, and of a registration the Registrar failed:
	// doubling from RetryInitial up to RetryMax, with jitter.
	RetryInitial, RetryMax time.Duration
	// OnRefused, if set, is called (from the watcher's goroutine) for
	// every refused registration, with the driver's name (possibly empty)
	// and the reason told to the registrar.
	OnRefused func(name, socket, reason string)
}

func (c Config) withDefaults() Config {
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.RegisterTimeout <= 0 {
		c.RegisterTimeout = DefaultRegisterTimout
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = DefaultRetryInitial
	}
	if c.RetryMax < c.RetryInitial {
		c.RetryMax = max(DefaultRetryMax, c.RetryInitial)
	}
	if c.Log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		c.Log = logrus.NewEntry(l)
	}
	return c
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Watcher watches a registration directory, as the kubelet's plugin
// watcher does, and registers the CSI drivers announced there. See the
// package documentation.
type Watcher struct {
	cfg    Config
	log    *logrus.Entry
	fsw    *fsnotify.Watcher
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	poke   chan struct{} // cap 1: desired changed

	mu      sync.Mutex
	desired map[string]fileID // guarded by mu; registration socket → its file

	// Owned by the reconcile goroutine.
	actual  map[string]*socketState
	initial map[string]bool        // sockets present at Start, until each is resolved
	pruned  bool                   // stale registrations of earlier runs removed
	gone    map[string]*retryState // drivers to deregister

	stopOnce sync.Once
}

// retryState paces the retries of a deregistration.
type retryState struct {
	attempts int
	retryAt  time.Time
}

// socketState is what the reconciler knows of one registration socket.
type socketState struct {
	id fileID
	// name is the driver this socket registered, once it is.
	name string
	// announced is the driver this socket announced (and the check let
	// through), registered or not yet.
	announced string
	// done: registered or refused; nothing to do until the socket changes.
	done     bool
	attempts int
	retryAt  time.Time
}

// Start checks that cfg.Dir is a directory, starts watching it (and its
// subdirectories), and registers the drivers of the registration sockets
// already there, in the background. Once every socket present at start
// has answered (or is known to have nothing listening), drivers registered
// from the directory by an earlier run that no socket announces any more
// are deregistered.
func Start(cfg Config) (*Watcher, error) {
	cfg = cfg.withDefaults()
	if cfg.Registrar == nil {
		return nil, errors.New("registration: no Registrar")
	}
	fi, err := os.Stat(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("registration directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("registration directory %s: not a directory", cfg.Dir)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("registration directory %s: watch: %w", cfg.Dir, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{
		cfg: cfg, log: cfg.Log.WithField("registration_dir", cfg.Dir), fsw: fsw,
		ctx: ctx, cancel: cancel, poke: make(chan struct{}, 1),
		desired: map[string]fileID{}, actual: map[string]*socketState{},
		initial: map[string]bool{}, gone: map[string]*retryState{},
	}
	// Watched before it is walked: a socket created in between is seen
	// twice, which is harmless.
	found, err := w.scan(cfg.Dir)
	if err != nil {
		cancel()
		_ = fsw.Close()
		return nil, err
	}
	w.desired = found
	for p := range found {
		w.initial[p] = true
	}
	w.log.WithField("sockets", len(found)).Info("watching the registration directory")
	w.wg.Add(2)
	go w.watch()
	go w.reconcileLoop()
	w.kick()
	return w, nil
}

// Shutdown stops watching and returns when the watcher's goroutines are
// gone. It registers and deregisters nothing: the allocations stay, and
// the next Start finds their sockets again. It is idempotent.
func (w *Watcher) Shutdown() {
	w.stopOnce.Do(func() {
		w.cancel()
		_ = w.fsw.Close()
	})
	w.wg.Wait()
}

func (w *Watcher) kick() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// scan watches dir and its subdirectories and returns the registration
// sockets in them. An error is returned only for dir itself; others are
// logged.
func (w *Watcher) scan(dir string) (map[string]fileID, error) {
	if err := w.fsw.Add(dir); err != nil {
		return nil, fmt.Errorf("registration directory %s: watch: %w", dir, err)
	}
	found := map[string]fileID{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			w.log.WithError(err).WithField("path", path).Warn("cannot read in the registration directory")
			return nil
		}
		if path == dir {
			return nil
		}
		if ignored(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if err := w.fsw.Add(path); err != nil {
				w.log.WithError(err).WithField("path", path).Warn("cannot watch a subdirectory of the registration directory")
			}
			return nil
		}
		if id, ok := socketID(path); ok {
			found[path] = id
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("registration directory %s: %w", dir, err)
	}
	return found, nil
}

// ignored says whether a name in the directory is skipped, as the kubelet
// skips it: names starting with '.'.
func ignored(name string) bool { return strings.HasPrefix(name, ".") }

// fileID tells a file apart from the one that was at its path before:
// an inode number is reused at once after a removal, its change time
// (nanoseconds) is not.
type fileID struct {
	ino   uint64
	ctime int64
}

// socketID returns the fileID of the unix socket at path; ok is false for
// anything else.
func socketID(path string) (id fileID, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSocket == 0 {
		return fileID{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{ino: st.Ino, ctime: st.Ctim.Nano()}, true
}

// watch turns file system events into the desired set of sockets until
// Shutdown.
func (w *Watcher) watch() {
	defer w.wg.Done()
	for {
		select {
		case <-w.ctx.Done():
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			w.handle(ev)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.handleErr(err)
		}
	}
}

// handleErr handles an error of the file system watch: lost events (the
// inotify queue overflowed) make it scan the directory again.
func (w *Watcher) handleErr(err error) {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		w.log.Warn("registration directory: events were lost; scanning it again")
		w.rescan()
		return
	}
	w.log.WithError(err).Warn("registration directory: watch error")
}

// handle applies one file system event to the desired set.
func (w *Watcher) handle(ev fsnotify.Event) {
	if ignored(filepath.Base(ev.Name)) {
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		fi, err := os.Lstat(ev.Name)
		if err != nil {
			return // gone already; its Remove event follows
		}
		if fi.IsDir() {
			// A new subdirectory: watch it, and take what is already
			// in it.
			found, err := w.scan(ev.Name)
			if err != nil {
				w.log.WithError(err).Warn("cannot watch a subdirectory of the registration directory")
				return
			}
			w.mu.Lock()
			for p, id := range found {
				w.desired[p] = id
			}
			w.mu.Unlock()
			w.kick()
			return
		}
		if id, ok := socketID(ev.Name); ok {
			w.mu.Lock()
			w.desired[ev.Name] = id
			w.mu.Unlock()
			w.kick()
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		// A removed (or moved away) socket, or a whole subdirectory.
		if ev.Name == w.cfg.Dir {
			w.log.Error("the registration directory was removed or moved: its drivers are deregistered, and nothing is watched until the agent restarts")
		}
		prefix := ev.Name + string(filepath.Separator)
		w.mu.Lock()
		for p := range w.desired {
			if p == ev.Name || strings.HasPrefix(p, prefix) {
				delete(w.desired, p)
			}
		}
		w.mu.Unlock()
		w.kick()
	}
}

// rescan rebuilds the desired set from the directory, after events were
// lost.
func (w *Watcher) rescan() {
	found, err := w.scan(w.cfg.Dir)
	if err != nil {
		w.log.WithError(err).Error("cannot scan the registration directory")
		return
	}
	w.mu.Lock()
	w.desired = found
	w.mu.Unlock()
	w.kick()
}

// reconcileLoop makes the registrations agree with the desired sockets,
// whenever they change and when a retry is due, until Shutdown.
func (w *Watcher) reconcileLoop() {
	defer w.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := w.reconcile()
		if w.ctx.Err() != nil {
			return
		}
		timer.Reset(time.Hour)
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-w.ctx.Done():
			return
		case <-w.poke:
		case <-timer.C:
		}
	}
}

// reconcile does what is due and returns when it should run again (zero:
// only on a change).
func (w *Watcher) reconcile() time.Time {
	w.mu.Lock()
	desired := make(map[string]fileID, len(w.desired))
	for p, id := range w.desired {
		desired[p] = id
	}
	w.mu.Unlock()

	// Sockets that went away, or were created anew.
	for p, st := range w.actual {
		if id, ok := desired[p]; !ok || id != st.id {
			delete(w.actual, p)
			delete(w.initial, p)
			if st.name != "" {
				w.driverGone(st.name, p)
			}
		}
	}
	for p := range w.initial {
		if _, ok := desired[p]; !ok {
			delete(w.initial, p)
		}
	}
	w.retryDeregistrations()

	now := time.Now()
	var next time.Time
	due := func(t time.Time) {
		if t.IsZero() {
			t = now
		}
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for p, id := range desired {
		if w.ctx.Err() != nil {
			return time.Time{}
		}
		st := w.actual[p]
		if st == nil {
			st = &socketState{id: id}
			w.actual[p] = st
		}
		if st.done {
			continue
		}
		if now.Before(st.retryAt) {
			due(st.retryAt)
			continue
		}
		w.attempt(p, st)
		if !st.done {
			due(st.retryAt)
		}
	}
	if !w.pruned && len(w.initial) == 0 {
		w.pruneStale()
		if !w.pruned {
			due(time.Now().Add(w.cfg.RetryInitial))
		}
	}
	for _, rs := range w.gone {
		due(rs.retryAt)
	}
	return next
}

// driverGone handles the removal of the registration socket p of driver
// name: the driver is deregistered, unless another socket registered it
// too, which then registers it again (its endpoint may differ).
func (w *Watcher) driverGone(name, p string) {
	for _, st := range w.actual {
		if st.name == name {
			st.done, st.name, st.attempts, st.retryAt = false, "", 0, time.Time{}
			w.log.WithFields(logrus.Fields{"plugin": name, "socket": p}).Info("registration socket removed; another socket registers the driver too")
			return
		}
	}
	w.log.WithFields(logrus.Fields{"plugin": name, "socket": p}).Info("registration socket removed; deregistering the driver")
	w.gone[name] = &retryState{}
}

// retryDeregistrations deregisters the drivers whose sockets are gone,
// those that are due.
func (w *Watcher) retryDeregistrations() {
	now := time.Now()
	for name, rs := range w.gone {
		if w.ctx.Err() != nil {
			return
		}
		if now.Before(rs.retryAt) {
			continue
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RegisterTimeout)
		err := w.cfg.Registrar.Deregister(ctx, name)
		cancel()
		if err != nil {
			if w.ctx.Err() == nil && logDue(rs.attempts) {
				w.log.WithError(err).WithField("plugin", name).Warn("cannot deregister a driver whose registration socket is gone; retrying")
			}
			rs.attempts++
			rs.retryAt = time.Now().Add(w.backoff(rs.attempts))
			continue
		}
		delete(w.gone, name)
	}
}

// pruneStale deregisters the drivers an earlier run registered from the
// directory that no registration socket announces in this run. It runs
// once every socket present at Start has answered, or is known to have
// nothing listening (or is gone).
func (w *Watcher) pruneStale() {
	ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RegisterTimeout)
	names, err := w.cfg.Registrar.Registered(ctx)
	cancel()
	if err != nil {
		if w.ctx.Err() == nil {
			w.log.WithError(err).Warn("cannot list the drivers registered from the registration directory; retrying")
		}
		return
	}
	w.pruned = true
	live := map[string]bool{}
	for _, st := range w.actual {
		if st.announced != "" {
			live[st.announced] = true // registered, or being retried
		}
	}
	for _, name := range names {
		if live[name] {
			continue
		}
		if _, ok := w.gone[name]; ok {
			continue
		}
		w.log.WithField("plugin", name).Info("no registration socket announces the driver any more; deregistering it")
		w.gone[name] = &retryState{}
	}
	w.retryDeregistrations()
}

// attempt asks the registrar on socket p what it registers and registers
// it; st records the outcome.
func (w *Watcher) attempt(p string, st *socketState) {
	log := w.log.WithField("socket", p)
	st.attempts++
	retry := func(err error, what string) {
		st.retryAt = time.Now().Add(w.backoff(st.attempts))
		if logDue(st.attempts - 1) {
			log.WithError(err).WithField("attempts", st.attempts).Warn(what + "; retrying")
		}
	}

	// A socket nothing listens on is not announcing anything: resolved
	// for the start-up prune, and tried again later.
	if err := probe(p, w.cfg.CallTimeout); err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			delete(w.initial, p)
		}
		retry(err, "cannot connect to a registration socket")
		return
	}
	c, err := NewClient(p)
	if err != nil {
		retry(err, "cannot connect to a registration socket")
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(w.ctx, w.cfg.CallTimeout)
	info, err := c.GetInfo(ctx)
	cancel()
	if err != nil {
		retry(err, "GetInfo on a registration socket failed")
		return
	}
	delete(w.initial, p)
	log = log.WithField("plugin", info.Name)

	d, err := checkInfo(info, p)
	if err == nil {
		st.announced = d.Name
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RegisterTimeout)
		err = w.cfg.Registrar.Register(ctx, d)
		cancel()
		if err != nil && !errors.Is(err, ErrRefused) {
			if w.ctx.Err() == nil {
				retry(err, "cannot register a driver")
			}
			return
		}
	}
	st.done, st.attempts, st.retryAt = true, 0, time.Time{}
	status := RegistrationStatus{PluginRegistered: err == nil}
	if err != nil {
		st.announced = ""
		status.Error = strings.TrimPrefix(err.Error(), ErrRefused.Error()+": ")
		log.WithField("reason", status.Error).Warn("driver registration refused")
		if w.cfg.OnRefused != nil {
			w.cfg.OnRefused(info.Name, p, status.Error)
		}
	} else {
		st.name = d.Name
		delete(w.gone, d.Name) // registered again: a pending deregistration is moot
		log.WithField("endpoint", d.Endpoint).Info("driver registered from the registration directory")
	}
	ctx, cancel = context.WithTimeout(w.ctx, w.cfg.CallTimeout)
	if err := c.NotifyRegistrationStatus(ctx, status); err != nil && w.ctx.Err() == nil {
		log.WithError(err).Warn("NotifyRegistrationStatus on a registration socket failed")
	}
	cancel()
}

// probe connects to the unix socket p and hangs up, so a socket nothing
// listens on (ECONNREFUSED) is told apart from one that does not answer.
func probe(p string, timeout time.Duration) error {
	c, err := net.DialTimeout("unix", p, timeout)
	if err != nil {
		return err
	}
	return c.Close()
}

// backoff is the wait before attempt n+1: doubling from RetryInitial up to
// RetryMax, ±20 % jitter.
func (w *Watcher) backoff(n int) time.Duration {
	d := w.cfg.RetryInitial
	for i := 1; i < n && d < w.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, w.cfg.RetryMax)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// logDue says whether failure number n (from 0) is logged: the first ones,
// then ever more rarely (1, 2, 4, 8, ...).
func logDue(n int) bool { return n&(n-1) == 0 }
