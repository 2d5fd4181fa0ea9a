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
	for range 50 {
		done := make(chan struct{})
		p.Go(func() { ran.Add(1); close(done) })
		<-done
		// Let the worker park before the next call.
		for range 100 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	if ran.Load() != 50 {
		t.Fatalf("ran %d functions, want 50", ran.Load())
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
