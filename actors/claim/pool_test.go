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
		time.Sleep(time.Millisecond) // let the worker park
	}
	if ran.Load() != 20 {
		t.Fatalf("ran %d functions, want 20", ran.Load())
	}
	if n := p.started.Load(); n > 5 {
		t.Errorf("started %d workers for 20 calls one after another; idle workers must be reused", n)
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
