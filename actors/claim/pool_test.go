package claim

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPool_Go_ReusesIdleWorkers(t *testing.T) {
	p := NewPool(time.Minute)
	defer p.Close()
	var ran atomic.Int32
	for range 20 {
		done := make(chan struct{})
		p.Go(func() { ran.Add(1); close(done) })
		<-done
		for idleWorkers(p) == 0 { // the worker parks
			time.Sleep(time.Millisecond)
		}
	}
	if ran.Load() != 20 {
		t.Fatalf("ran %d functions, want 20", ran.Load())
	}
	if n := p.started.Load(); n != 1 {
		t.Errorf("started %d workers for 20 calls one after another; the idle worker must be reused", n)
	}
}

func TestPool_Close_WaitsForBusyWorkers(t *testing.T) {
	p := NewPool(time.Minute)
	var wg sync.WaitGroup
	var finished atomic.Int32
	release := make(chan struct{})
	for range 4 {
		wg.Add(1)
		p.Go(func() {
			wg.Done()
			<-release
			finished.Add(1)
		})
	}
	wg.Wait()
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while workers were busy")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-closed
	if finished.Load() != 4 {
		t.Errorf("%d functions finished before Close returned, want 4", finished.Load())
	}
	p.Close() // idempotent
}

// The worker that went idle last gets the next function: its stack is the
// one most likely still grown, its memory the one most likely cached.
func TestPool_Go_MostRecentlyIdleWorkerFirst(t *testing.T) {
	p := NewPool(time.Minute)
	defer p.Close()
	// Three workers busy at once, then idle in the order 0, 1, 2.
	release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	type started struct {
		i  int
		id string
	}
	ids := make(chan started, 3)
	for i := range 3 {
		p.Go(func() { ids <- started{i, goid()}; <-release[i] })
	}
	byOrder := map[string]int{}
	for range 3 {
		s := <-ids
		byOrder[s.id] = s.i
	}
	for i := range 3 {
		close(release[i])
		for idleWorkers(p) != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	got := make(chan string, 1)
	p.Go(func() { got <- goid() })
	id := <-got
	if n, ok := byOrder[id]; !ok || n != 2 {
		t.Errorf("the next function ran on worker %d (of 0, 1, 2 by start order, idle in that order); want 2, the last to go idle", n)
	}
	if n := p.started.Load(); n != 3 {
		t.Errorf("started %d workers, want 3", n)
	}
}

// Workers idle for the pool's idle time exit; busy and recently used ones
// stay.
func TestPool_IdleWorkersExit(t *testing.T) {
	p := NewPool(20 * time.Millisecond)
	defer p.Close()
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 4 {
		wg.Add(1)
		p.Go(func() { wg.Done(); <-release })
	}
	wg.Wait()
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for idleWorkers(p) != 0 || runningWorkers(p) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers idle and %d running after 10s; idle ones must exit after 20ms", idleWorkers(p), runningWorkers(p))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The pool still works, with a new worker.
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	if n := p.started.Load(); n != 5 {
		t.Errorf("started %d workers, want 5 (4, then one more after they exited)", n)
	}
}

func idleWorkers(p *Pool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.stack)
}

func runningWorkers(p *Pool) int { return int(p.live.Load()) }
