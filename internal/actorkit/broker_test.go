package actorkit

import (
	"errors"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

type ev struct {
	n      int
	lagged uint64
}

func newTestBroker() *Broker[ev] {
	return NewBroker(func(d uint64) ev { return ev{lagged: d} })
}

func recv(t *testing.T, c <-chan ev) ev {
	t.Helper()
	select {
	case v, ok := <-c:
		if !ok {
			t.Fatal("channel closed")
		}
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received")
		return ev{}
	}
}

func TestBroker_Publish_InOrder(t *testing.T) {
	defer leakcheck.Check(t)()
	b := newTestBroker()
	defer b.Close()
	s1, _ := b.Subscribe(100)
	s2, _ := b.Subscribe(100)
	for i := range 50 {
		b.Publish(ev{n: i})
	}
	for _, s := range []*Subscription[ev]{s1, s2} {
		for i := range 50 {
			if v := recv(t, s.C); v.n != i || v.lagged != 0 {
				t.Fatalf("got %+v, want %d", v, i)
			}
		}
	}
}

// A subscriber that reads nothing must not stall Publish; when it reads
// again it gets a lag marker with the count, then the newest values.
func TestBroker_Publish_StuckSubscriberLagsAndOthersDoNot(t *testing.T) {
	defer leakcheck.Check(t)()
	b := newTestBroker()
	defer b.Close()
	stuck, _ := b.Subscribe(3)
	live, _ := b.Subscribe(1000)
	const n = 500
	for i := range n {
		b.Publish(ev{n: i}) // returns although stuck reads nothing
	}
	for i := range n {
		if v := recv(t, live.C); v.n != i {
			t.Fatalf("live subscriber got %+v, want %d", v, i)
		}
	}
	// stuck: whatever it reads is in order, every loss is announced by a
	// marker, and it ends with the newest values.
	var delivered []int
	var lost uint64
	for len(delivered) == 0 || delivered[len(delivered)-1] != n-1 {
		v := recv(t, stuck.C)
		if v.lagged > 0 {
			lost += v.lagged
			continue
		}
		if len(delivered) > 0 && v.n <= delivered[len(delivered)-1] {
			t.Fatalf("out of order: %d after %v", v.n, delivered)
		}
		delivered = append(delivered, v.n)
	}
	if uint64(len(delivered))+lost != n {
		t.Errorf("delivered %d + announced lost %d != published %d", len(delivered), lost, n)
	}
	if lost == 0 || len(delivered) > 3+2 {
		t.Errorf("delivered %v: a 3-value buffer must have dropped most of %d", delivered, n)
	}
	if d := stuck.Dropped(); d != lost {
		t.Errorf("Dropped() = %d, markers announced %d", d, lost)
	}
	if d := live.Dropped(); d != 0 {
		t.Errorf("live Dropped() = %d, want 0", d)
	}
}

func TestBroker_Close_EndsSubscriptions(t *testing.T) {
	defer leakcheck.Check(t)()
	b := newTestBroker()
	s, _ := b.Subscribe(10)
	b.Publish(ev{n: 1})
	s2, _ := b.Subscribe(10)
	s2.Cancel()
	s2.Cancel() // idempotent
	if _, ok := <-s2.C; ok {
		t.Error("cancelled subscription still delivers")
	}
	if got := b.Subscribers(); got != 1 {
		t.Errorf("Subscribers() = %d, want 1", got)
	}
	b.Close()
	b.Close()
	for range s.C { // drains whatever was handed over, then closed
	}
	if _, err := b.Subscribe(1); !errors.Is(err, ErrBrokerClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrBrokerClosed", err)
	}
	b.Publish(ev{n: 2}) // no subscribers, no panic
}

// SubscribeFrom delivers its first values before the ones published
// after it, in order; first values beyond the buffer are dropped oldest
// first and reported by one lag marker, like late reading of live ones.
func TestBroker_SubscribeFrom_FirstThenLive(t *testing.T) {
	defer leakcheck.Check(t)()
	b := newTestBroker()
	defer b.Close()
	s, err := b.SubscribeFrom(10, []ev{{n: 0}, {n: 1}, {n: 2}})
	if err != nil {
		t.Fatal(err)
	}
	b.Publish(ev{n: 3})
	for i := range 4 {
		if v := recv(t, s.C); v.n != i || v.lagged != 0 {
			t.Fatalf("value %d: got %+v", i, v)
		}
	}

	small, err := b.SubscribeFrom(2, []ev{{n: 10}, {n: 11}, {n: 12}})
	if err != nil {
		t.Fatal(err)
	}
	if v := recv(t, small.C); v.lagged != 1 {
		t.Fatalf("got %+v, want a lag marker for 1 value", v)
	}
	for _, want := range []int{11, 12} {
		if v := recv(t, small.C); v.n != want || v.lagged != 0 {
			t.Fatalf("got %+v, want %d", v, want)
		}
	}
	if got := small.Dropped(); got != 1 {
		t.Fatalf("Dropped() = %d, want 1", got)
	}
}
