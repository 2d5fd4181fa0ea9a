package csi

import (
	"context"
	"errors"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// waitDone waits for ctx to end, failing the test after a generous bound.
func waitDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: context not ended", what)
	}
}

func TestDeadlines_EndsOnlyExpiredCalls(t *testing.T) {
	d := newDeadlines()
	defer d.stop()
	short, doneShort := d.start(context.Background(), 20*time.Millisecond)
	defer doneShort()
	long, doneLong := d.start(context.Background(), time.Hour)
	defer doneLong()
	if dl, ok := short.Deadline(); !ok || time.Until(dl) > 20*time.Millisecond {
		t.Fatalf("short call deadline = %v, %v; want within 20ms", dl, ok)
	}
	waitDone(t, short, "short call")
	if !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Fatalf("expired call Err = %v; want DeadlineExceeded", short.Err())
	}
	if long.Err() != nil {
		t.Fatalf("hour-long call ended early: %v", long.Err())
	}
}

func TestDeadlines_EarlierDeadlineRearms(t *testing.T) {
	d := newDeadlines()
	defer d.stop()
	// The timer is armed for an hour first; a later, shorter call must
	// still end on time.
	_, doneLong := d.start(context.Background(), time.Hour)
	defer doneLong()
	short, doneShort := d.start(context.Background(), 10*time.Millisecond)
	defer doneShort()
	waitDone(t, short, "shorter call started second")
	if !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v; want DeadlineExceeded", short.Err())
	}
}

func TestDeadlines_FinishedCallsAreForgotten(t *testing.T) {
	d := newDeadlines()
	defer d.stop()
	for range 1000 {
		_, done := d.start(context.Background(), time.Minute)
		done()
	}
	d.mu.Lock()
	n := d.queues[time.Minute].Len()
	d.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d finished calls still watched", n)
	}
	// With nothing left, the next fire drops the timer.
	d.fire()
	d.mu.Lock()
	armed := d.timer != nil
	d.mu.Unlock()
	if armed {
		t.Fatal("timer still armed with no call watched")
	}
}

func TestDeadlines_CallerDeadlineFirst(t *testing.T) {
	d := newDeadlines()
	defer d.stop()
	parent, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	want, _ := parent.Deadline()
	ctx, done := d.start(parent, time.Hour)
	defer done()
	if got, ok := ctx.Deadline(); !ok || !got.Equal(want) {
		t.Fatalf("deadline = %v, %v; want the caller's %v", got, ok, want)
	}
}

func TestDeadlines_ParentCancelAndStop(t *testing.T) {
	d := newDeadlines()
	parent, cancel := context.WithCancel(context.Background())
	a, doneA := d.start(parent, time.Hour)
	defer doneA()
	cancel()
	waitDone(t, a, "call of a canceled parent")
	if !errors.Is(a.Err(), context.Canceled) {
		t.Fatalf("Err = %v; want Canceled", a.Err())
	}
	b, doneB := d.start(context.Background(), time.Hour)
	defer doneB()
	d.stop()
	waitDone(t, b, "call watched at stop")
}

// A hanging plugin call through the client gets DeadlineExceeded, and calls
// of the same client that answer are not disturbed. The timeout is long
// enough for an answering call on a loaded machine (50 ms was not, with
// the race detector at a load of 15 on 2 cores): what is checked is that
// the watchdog ends only the call that hangs.
func TestClient_RPCTimeoutThroughWatchdog(t *testing.T) {
	p, c := startPlugin(t, fakeplugin.Config{}, WithRPCTimeout(time.Second))
	ctx := testCtx(t)
	p.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Hang: true})
	errc := make(chan error, 1)
	go func() {
		errc <- c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
	}()
	for range 20 {
		if _, err := c.NodeCapabilities(ctx); err != nil {
			t.Fatalf("NodeCapabilities next to a hanging call: %v", err)
		}
	}
	if err := <-errc; Code(err) != codes.DeadlineExceeded {
		t.Fatalf("hanging NodeUnpublishVolume = %v; want DeadlineExceeded", err)
	}
}
