package fakeplugin

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SignalRecorder records the stop signals (SIGTERM, SIGINT, SIGHUP) a
// plugin process receives, one name per line in a file, so that a test
// can count them after the process is gone: a plugin started by the agent
// must get exactly one SIGTERM when it is stopped, since many take a
// second one as "exit now, skip the graceful stop".
//
// In the plugin process:
//
//	r, err := fakeplugin.RecordSignals(path)
//	... serve ...
//	<-r.First()  // the first stop signal: stop gracefully
//	p.Stop()
//	r.Close(time.Second) // and exit 0
type SignalRecorder struct {
	f     *os.File
	ch    chan os.Signal
	first chan struct{}
	done  chan struct{}

	mu sync.Mutex // guards f's writes against Close
}

// RecordSignals starts recording the stop signals this process receives
// to path (created, or appended to: a restarted plugin adds its own
// lines). While it records, the signals do not end the process.
func RecordSignals(path string) (*SignalRecorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fakeplugin: signal log: %w", err)
	}
	r := &SignalRecorder{f: f, ch: make(chan os.Signal, 16), first: make(chan struct{}), done: make(chan struct{})}
	signal.Notify(r.ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		defer close(r.done)
		seen := false
		for s := range r.ch {
			r.mu.Lock()
			_, _ = fmt.Fprintln(r.f, SignalName(s))
			_ = r.f.Sync()
			r.mu.Unlock()
			if !seen {
				seen = true
				close(r.first)
			}
		}
	}()
	return r, nil
}

// First is closed when the first stop signal has been recorded.
func (r *SignalRecorder) First() <-chan struct{} { return r.first }

// Close goes on recording for linger, to catch a signal that follows the
// first (a stop that signals twice sends the second at once, but the
// process may see it later), then stops recording and closes the file.
// The process stays alive for linger: keep it short.
func (r *SignalRecorder) Close(linger time.Duration) {
	if linger > 0 {
		t := time.NewTimer(linger)
		<-t.C
	}
	signal.Stop(r.ch)
	close(r.ch)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.f.Close()
}

// SignalName is how a SignalRecorder writes s: "SIGTERM", "SIGINT",
// "SIGHUP".
func SignalName(s os.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

// ReadSignals returns the signals recorded in path, oldest first; none
// when the file does not exist.
func ReadSignals(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fakeplugin: signal log: %w", err)
	}
	return strings.Fields(string(data)), nil
}
