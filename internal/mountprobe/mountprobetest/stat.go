// Package mountprobetest has a hand-written stat for tests of mount
// probes (mountprobe.Config.Stat): each path answers the error a test
// sets for it, or hangs as a stat of a hung FUSE mount does.
package mountprobetest

import (
	"sync"
	"syscall"
)

// Stat is a stat function for mountprobe.Config.Stat. Use New; it is safe
// for concurrent use.
type Stat struct {
	mu      sync.Mutex
	errs    map[string]error // guarded by mu
	hung    map[string]bool  // guarded by mu
	calls   map[string]int   // guarded by mu
	release chan struct{}
	once    sync.Once
}

// New returns a Stat under which every path answers (nil).
func New() *Stat {
	return &Stat{errs: map[string]error{}, hung: map[string]bool{}, calls: map[string]int{}, release: make(chan struct{})}
}

// Stat is the stat of path: it answers the error set for path, or, for a
// hung path, blocks until Release and then answers ENOTCONN (as a stat of
// a hung FUSE mount returns once its server is killed).
func (s *Stat) Stat(path string) error {
	s.mu.Lock()
	s.calls[path]++
	err, hung := s.errs[path], s.hung[path]
	s.mu.Unlock()
	if hung {
		<-s.release
		return syscall.ENOTCONN
	}
	return err
}

// Set makes the stats of path that start from now on answer err at once.
func (s *Stat) Set(path string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.hung, path)
	s.errs[path] = err
}

// Hang makes the stats of path that start from now on hang until Release.
func (s *Stat) Hang(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hung[path] = true
}

// Release ends every hung stat, and those to come, with ENOTCONN. It may
// be called more than once (tests call it on cleanup too).
func (s *Stat) Release() { s.once.Do(func() { close(s.release) }) }

// Calls returns how many stats of path have started.
func (s *Stat) Calls(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[path]
}
