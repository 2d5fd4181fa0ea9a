package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// registered returns the volume IDs of the volume-registered events in
// evs, in order.
func registered(evs []runtime.Event) []string {
	var ids []string
	for _, e := range evs {
		if e.Type == runtime.EventVolumeRegistered {
			ids = append(ids, e.Volume)
		}
	}
	return ids
}

func volID(i int) string { return fmt.Sprintf("vol-%03d", i) }

// TestRuntime_Subscribe_BacklogThenLive subscribes while volumes are being
// registered and checks that the subscriber sees every registration exactly
// once, in order: the ones before the subscription from the backlog, the
// others live, with no gap or repeat at the seam.
func TestRuntime_Subscribe_BacklogThenLive(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	const total = 60
	half := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		for i := range total {
			if i == total/2 {
				close(half)
			}
			if _, err := e.rt.RegisterVolume(ctx, volID(i), volSpecFor(volID(i), "single-node-writer")); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	<-half
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := e.rt.Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []runtime.Event
	timeout := time.After(waitLimit)
	for len(registered(got)) < total {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed after %d registrations", len(registered(got)))
			}
			if err := ev.Validate(); err != nil {
				t.Errorf("event %+v: %v", ev, err)
			}
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("saw %d of %d registrations: %v", len(registered(got)), total, registered(got))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ids := registered(got)
	for i, id := range ids {
		if id != volID(i) {
			t.Fatalf("registrations seen = %v; want vol-000 … vol-%03d once each, in order", ids, total-1)
		}
	}
	cancel()
	for range ch { // closed once ctx is done
	}
	recent, err := e.rt.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids := registered(recent); len(ids) != total || ids[0] != volID(0) {
		t.Errorf("Events() registrations = %v", ids)
	}
}

// TestRuntime_Subscribe_StuckSubscriber leaves a subscriber that never
// reads and checks that the runtime goes on (here: hundreds of
// registrations, more than the subscriber's queue), and that the stuck
// subscriber, when it reads at last, is told how many events it lost.
func TestRuntime_Subscribe_StuckSubscriber(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	stuck, err := e.rt.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live, err := e.rt.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 3 * runtime.RecentEvents
	liveSeen := make(chan int, 1)
	go func() {
		n := 0
		for ev := range live {
			if ev.Type == runtime.EventVolumeRegistered {
				n++
				if n == total {
					liveSeen <- n
				}
			}
		}
	}()
	for i := range total {
		if _, err := e.rt.RegisterVolume(ctx, volID(i), volSpecFor(volID(i), "single-node-writer")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-liveSeen:
	case <-time.After(waitLimit):
		t.Fatal("a reading subscriber did not see every event while another was stuck")
	}

	var dropped []runtime.Event
	var regs int
	for regs+len(dropped) < runtime.RecentEvents {
		ev := <-stuck
		switch ev.Type {
		case runtime.EventsDropped:
			dropped = append(dropped, ev)
		case runtime.EventVolumeRegistered:
			regs++
		}
	}
	if len(dropped) == 0 || !strings.Contains(dropped[0].Message, "lost") || dropped[0].Time.IsZero() {
		t.Errorf("stuck subscriber got no proper events-dropped event: %+v", dropped)
	}
	recent, err := e.rt.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids := registered(recent); len(recent) != runtime.RecentEvents || len(ids) != runtime.RecentEvents ||
		ids[0] != volID(total-runtime.RecentEvents) || ids[len(ids)-1] != volID(total-1) {
		t.Errorf("Events() = %d events, registrations %v; want the last %d", len(recent), ids, runtime.RecentEvents)
	}
	e.stop()
	for range stuck { // closed by Shutdown
	}
}
