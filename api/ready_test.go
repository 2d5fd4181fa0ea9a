package api_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// GET /v1/ready: 503 with what is pending while starting, then 200; on the
// unix socket and, for anyone, on the TCP listener; the client reads both.
func TestReady_StartingThenOK(t *testing.T) {
	ctx := context.Background()
	b := apitest.NewBackend()
	b.SetPending("allocation example (plugin example): starting", "volume data1: alloc web1 repairing (target path)")
	unix := apitest.Serve(t, b, api.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apitest.ServeListener(t, l, api.NewTCPHandler(b, "", api.Options{}))
	tcp := "http://" + l.Addr().String()

	for _, addr := range []string{unix, tcp} {
		r := newRawClient(t, addr).do("GET", "/v1/ready", "")
		want := `{"status":"starting","pending":["allocation example (plugin example): starting","volume data1: alloc web1 repairing (target path)"]}`
		if r.status != 503 || r.body != want+"\n" {
			t.Errorf("%s GET /v1/ready while starting: %d %s; want 503 %s", addr, r.status, r.body, want)
		}
		if r := newRawClient(t, addr).do("GET", "/v1/ready?x=1", ""); r.status != 400 {
			t.Errorf("%s GET /v1/ready?x=1: %d, want 400", addr, r.status)
		}
	}
	c := newClient(t, unix)
	rd, err := c.Ready(ctx)
	if err != nil || rd.Status != runtime.ReadyStarting || len(rd.Pending) != 2 {
		t.Errorf("Client.Ready while starting = %+v, %v", rd, err)
	}

	b.SetPending()
	for _, addr := range []string{unix, tcp} {
		if r := newRawClient(t, addr).do("GET", "/v1/ready", ""); r.status != 200 || r.body != `{"status":"ok"}`+"\n" {
			t.Errorf("%s GET /v1/ready when ready: %d %s", addr, r.status, r.body)
		}
	}
	if rd, err := c.Ready(ctx); err != nil || rd.Status != runtime.ReadyOK || !slices.Equal(rd.Pending, nil) {
		t.Errorf("Client.Ready when ready = %+v, %v", rd, err)
	}

	b.FailWith("Ready", runtime.ErrShutdown)
	var ae *api.Error
	if _, err := c.Ready(ctx); !errors.As(err, &ae) || ae.Status != 503 {
		t.Errorf("Client.Ready when the backend fails = %v, want an *api.Error with status 503", err)
	}
}
