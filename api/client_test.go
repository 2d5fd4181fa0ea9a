package api_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func newClient(t *testing.T, addr string, opts ...api.ClientOption) *api.Client {
	t.Helper()
	c, err := api.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("NewClient(%q): %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func testVolumeSpec() runtime.VolumeSpec {
	return runtime.VolumeSpec{
		Plugin:     "hostpath",
		ExternalID: "ext-1",
		Capabilities: []runtime.Capability{
			{AccessMode: "single-node-writer", AttachmentMode: "file-system"},
			{AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"},
		},
		MountOptions: &runtime.MountOptions{FSType: "ext4", MountFlags: []string{"password=hunter2"}},
		Parameters:   map[string]string{"tier": "fast"},
		Secrets:      map[string]string{"apikey": "topsecret"},
	}
}

// Every Client method against the fake over a real unix socket.
func TestClient_Methods_Unix(t *testing.T) {
	ctx := context.Background()
	b := apitest.NewBackend()
	c := newClient(t, apitest.Serve(t, b, api.Options{}))

	if err := c.Health(ctx); err != nil {
		t.Fatalf("Health: %v", err)
	}
	a, err := c.RegisterAllocation(ctx, "hp1", runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/run/hp.sock"})
	if err != nil || a.ID != "hp1" || !a.Healthy || !a.Singleton || a.NodeID != "node-1" {
		t.Fatalf("RegisterAllocation = %+v, %v", a, err)
	}
	as, err := c.Allocations(ctx)
	if err != nil || len(as) != 1 || as[0].Socket != "/run/hp.sock" {
		t.Fatalf("Allocations = %+v, %v", as, err)
	}
	ps, err := c.Plugins(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "hostpath" || ps[0].NodesHealthy != 1 || len(ps[0].Allocations) != 1 {
		t.Fatalf("Plugins = %+v, %v", ps, err)
	}
	p, err := c.Plugin(ctx, "hostpath")
	if err != nil || p.ControllersExpected != 1 {
		t.Fatalf("Plugin = %+v, %v", p, err)
	}

	spec := testVolumeSpec()
	v, err := c.RegisterVolume(ctx, "vol1", spec)
	if err != nil || v.ID != "vol1" || v.MountOptions == nil || v.MountOptions.MountFlagCount != 1 {
		t.Fatalf("RegisterVolume = %+v, %v", v, err)
	}
	// The secrets and mount flags reached the backend intact.
	got, ok := b.ReceivedVolumeSpec("vol1")
	if !ok || !reflect.DeepEqual(got, spec) {
		t.Fatalf("backend received %#v (secret %q), want %#v", got, got.Secrets["apikey"], spec)
	}
	cv, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol2", VolumeSpec: runtime.VolumeSpec{
		Plugin: "hostpath", Capabilities: spec.Capabilities[:1], Secrets: map[string]string{"k": "v"},
	}, CapacityBytes: 5 << 20})
	if err != nil || cv.ExternalID != "ext-vol2" || cv.CapacityBytes != 5<<20 {
		t.Fatalf("CreateVolume = %+v, %v", cv, err)
	}
	if got, _ := b.ReceivedVolumeSpec("vol2"); got.Secrets["k"] != "v" {
		t.Errorf("create secrets did not reach the backend: %v", got.Secrets)
	}
	vs, err := c.Volumes(ctx, runtime.VolumeFilter{Plugin: "hostpath"})
	if err != nil || len(vs) != 2 {
		t.Fatalf("Volumes = %+v, %v", vs, err)
	}

	cl, err := c.Claim(ctx, "vol1", runtime.ClaimRequest{Alloc: "w1", Mode: runtime.ModeRead, AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"})
	if err != nil || cl.State != runtime.ClaimPublished || !strings.HasSuffix(cl.TargetPath, "/per-alloc/w1/vol1/ro-file-system-multi-node-reader-only") {
		t.Fatalf("Claim = %+v, %v", cl, err)
	}
	vs, err = c.Volumes(ctx, runtime.VolumeFilter{Node: "node-1"})
	if err != nil || len(vs) != 1 || vs[0].ID != "vol1" {
		t.Fatalf("Volumes(node) = %+v, %v", vs, err)
	}
	v, err = c.Volume(ctx, "vol1")
	if err != nil || len(v.Claims) != 1 || v.Claims[0].Alloc != "w1" {
		t.Fatalf("Volume = %+v, %v", v, err)
	}
	rel, err := c.Release(ctx, "vol1", "w1")
	if err != nil || rel.State != runtime.ClaimTaken {
		t.Fatalf("Release = %+v, %v", rel, err)
	}
	if err := c.DeleteVolume(ctx, "vol2", true); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if err := c.DeregisterAllocation(ctx, "hp1"); err != nil {
		t.Fatalf("DeregisterAllocation: %v", err)
	}
	evs, err := c.Events(ctx)
	if err != nil || len(evs) != 7 {
		t.Fatalf("Events = %d events %+v, %v; want 7", len(evs), evs, err)
	}
	if evs[len(evs)-1].Type != runtime.EventAllocationDeregistered {
		t.Errorf("last event = %+v", evs[len(evs)-1])
	}
}

// Error answers become *api.Error and match the runtime sentinels.
func TestClient_Errors_Sentinels(t *testing.T) {
	ctx := context.Background()
	b := apitest.NewBackend()
	c := newClient(t, apitest.Serve(t, b, api.Options{}))

	_, err := c.Volume(ctx, "nope")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Message != `volume "nope" not found` || !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Volume(unknown) = %v (%#v)", err, ae)
	}
	_, err = c.RegisterAllocation(ctx, "a", runtime.AllocationSpec{Plugin: "p", Type: "bogus", Socket: "/s"})
	if !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), `type: "bogus"`) {
		t.Errorf("RegisterAllocation(bad) = %v", err)
	}
	_, err = c.RegisterVolume(ctx, "v", testVolumeSpec())
	if !errors.Is(err, runtime.ErrPluginUnavailable) || !errors.As(err, &ae) || ae.Status != 503 {
		t.Errorf("RegisterVolume(no plugin) = %v", err)
	}
	b.FailWith("Claim", runtime.ErrConflict)
	_, err = c.Claim(ctx, "v", runtime.ClaimRequest{Alloc: "a", Mode: "read", AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"})
	if !errors.Is(err, runtime.ErrConflict) {
		t.Errorf("Claim(conflict) = %v", err)
	}
	b.FailWith("Plugins", errors.New("boom"))
	_, err = c.Plugins(ctx)
	if !errors.As(err, &ae) || ae.Status != 500 || ae.Message != "boom" || errors.Unwrap(err) != nil {
		t.Errorf("Plugins(500) = %v", err)
	}
}

// A non-JSON error answer (a proxy, say) still becomes *api.Error.
func TestClient_Errors_NonJSON(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apitest.ServeListener(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	c := newClient(t, "http://"+l.Addr().String())
	err = c.Health(context.Background())
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Message != "502 bad gateway" {
		t.Errorf("Health via a proxy error = %v", err)
	}
}

func TestClient_Token_TCP(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apitest.ServeListener(t, l, api.NewTCPHandler(apitest.NewBackend(), "tok", api.Options{}))
	addr := "http://" + l.Addr().String()

	anon := newClient(t, addr)
	if err := anon.Health(ctx); err != nil {
		t.Errorf("Health without token: %v", err)
	}
	_, err = anon.Plugins(ctx)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 401 || !errors.Is(err, api.ErrUnauthorized) {
		t.Errorf("Plugins without token = %v, want 401 and ErrUnauthorized", err)
	}
	_, err = newClient(t, addr, api.WithToken("wrong")).Plugins(ctx)
	if !errors.Is(err, api.ErrUnauthorized) {
		t.Errorf("Plugins with a wrong token = %v, want ErrUnauthorized", err)
	}
	authed := newClient(t, addr, api.WithToken("tok"))
	if _, err := authed.Plugins(ctx); err != nil {
		t.Errorf("Plugins with token: %v", err)
	}
}

func TestNewClient_Address_Cases(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"unix:///var/lib/csiactor/api.sock", true},
		{"/var/lib/csiactor/api.sock", true},
		{"http://127.0.0.1:7460", true},
		{"http://127.0.0.1:7460/", true},
		{"https://agent.example:7460", true},
		{"unix://relative/api.sock", false},
		{"unix:relative", false},
		{"unix:///x?y=1", false},
		{"http://", false},
		{"http://host/path", false},
		{"http://user:pw@host:1", false},
		{"tcp://127.0.0.1:7460", false},
		{"127.0.0.1:7460", false},
		{"", false},
	} {
		c, err := api.NewClient(tc.addr)
		if tc.ok {
			if err != nil {
				t.Errorf("NewClient(%q) = %v", tc.addr, err)
			} else {
				c.Close()
			}
			continue
		}
		if !errors.Is(err, api.ErrBadAddress) {
			t.Errorf("NewClient(%q) = %v, want ErrBadAddress", tc.addr, err)
		}
	}
}

func TestClient_Unreachable_Message(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	addr := "unix://" + filepath.Join(dir, "api.sock")
	_, err := newClient(t, addr).Plugins(ctx)
	var ue *api.UnreachableError
	want := "cannot reach the agent at " + addr + ": connect: no such file or directory; is `csiactor agent` running? set -address or CSIACTOR_ADDR"
	if !errors.As(err, &ue) || err.Error() != want || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Plugins on a missing socket = %v\nwant %s", err, want)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcp := "http://" + l.Addr().String()
	l.Close()
	err = newClient(t, tcp).Health(ctx)
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "cannot reach the agent at "+tcp+": connect: connection refused") {
		t.Errorf("Health on a closed port = %v", err)
	}
}

// Following events: the backlog, then new events as they happen; cancel
// ends the stream on both sides and leaves no goroutine behind.
func TestClient_Subscribe_FollowAndCancel(t *testing.T) {
	defer leakcheck.Check(t)()
	b := apitest.NewBackend()
	b.Publish(runtime.Event{Type: runtime.EventAllocationRegistered, Alloc: "a1", Message: "old"})
	// The server and client live in a subtest so that their cleanups run
	// before the leak check.
	t.Run("stream", func(t *testing.T) {
		c := newClient(t, apitest.Serve(t, b, api.Options{}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := c.Subscribe(ctx)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		if ev := recv(t, ch); ev.Message != "old" {
			t.Fatalf("first event = %+v, want the backlog", ev)
		}
		waitFor(t, "server subscribed", func() bool { return b.Subscribers() == 1 })
		b.Publish(runtime.Event{Type: runtime.EventHealthChanged, Alloc: "a1", Message: "new"})
		if ev := recv(t, ch); ev.Message != "new" || ev.Time.IsZero() {
			t.Fatalf("second event = %+v", ev)
		}
		cancel()
		for range ch { // drains, then sees the close
		}
		waitFor(t, "server unsubscribed", func() bool { return b.Subscribers() == 0 })
	})
}

func TestClient_FollowEvents_Cases(t *testing.T) {
	defer leakcheck.Check(t)()
	b := apitest.NewBackend()
	t.Run("cancel", func(t *testing.T) {
		c := newClient(t, apitest.Serve(t, b, api.Options{}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var got []string
		errc := make(chan error, 1)
		go func() {
			errc <- c.FollowEvents(ctx, func(ev runtime.Event) error {
				got = append(got, ev.Message)
				if len(got) == 2 {
					cancel()
				}
				return nil
			})
		}()
		waitFor(t, "server subscribed", func() bool { return b.Subscribers() == 1 })
		b.Publish(runtime.Event{Type: "x", Message: "one"})
		b.Publish(runtime.Event{Type: "x", Message: "two"})
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("FollowEvents after cancel = %v, want context.Canceled", err)
		}
		if !reflect.DeepEqual(got, []string{"one", "two"}) {
			t.Errorf("got events %q", got)
		}
		waitFor(t, "server unsubscribed", func() bool { return b.Subscribers() == 0 })
	})
	t.Run("callback error", func(t *testing.T) {
		c := newClient(t, apitest.Serve(t, b, api.Options{}))
		stop := errors.New("stop")
		err := c.FollowEvents(context.Background(), func(runtime.Event) error { return stop })
		if !errors.Is(err, stop) {
			t.Errorf("FollowEvents = %v, want the callback's error", err)
		}
	})
	t.Run("subscribe fails", func(t *testing.T) {
		b := apitest.NewBackend()
		b.FailWith("Subscribe", runtime.ErrShutdown)
		c := newClient(t, apitest.Serve(t, b, api.Options{}))
		err := c.FollowEvents(context.Background(), func(runtime.Event) error { return nil })
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != 503 {
			t.Errorf("FollowEvents = %v, want a 503", err)
		}
	})
	t.Run("agent ends the stream", func(t *testing.T) {
		// A backend whose subscription ends by itself, as when the
		// runtime shuts down.
		c := newClient(t, apitest.Serve(t, endingBackend{apitest.NewBackend()}, api.Options{}))
		err := c.FollowEvents(context.Background(), func(runtime.Event) error { return nil })
		if !errors.Is(err, api.ErrStreamEnded) {
			t.Errorf("FollowEvents = %v, want ErrStreamEnded", err)
		}
	})
}

// endingBackend's subscriptions deliver one event and end.
type endingBackend struct{ *apitest.Backend }

func (endingBackend) Subscribe(context.Context) (<-chan runtime.Event, error) {
	ch := make(chan runtime.Event, 1)
	ch <- runtime.Event{Time: time.Now(), Type: "x", Message: "last"}
	close(ch)
	return ch, nil
}

func recv(t *testing.T, ch <-chan runtime.Event) runtime.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("event channel closed early")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return runtime.Event{}
}

// waitFor polls cond until it holds, failing after 10 s. It waits for a
// state change in another goroutine; it does not measure speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
