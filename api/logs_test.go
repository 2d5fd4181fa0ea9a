package api_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func logsBackend(t *testing.T) *apitest.Backend {
	t.Helper()
	b := apitest.NewBackend()
	ctx := context.Background()
	if _, err := b.RegisterAllocation(ctx, "e1", runtime.AllocationSpec{Plugin: "p", Type: runtime.TypeNode, Command: []string{"/bin/p"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RegisterAllocation(ctx, "a1", runtime.AllocationSpec{Plugin: "p", Type: runtime.TypeNode, Socket: "/run/p.sock"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b.AppendLogs("e1",
		runtime.LogLine{Time: t0, Stream: "stdout", Line: "one"},
		runtime.LogLine{Time: t0.Add(time.Second), Stream: "stderr", Line: "two"},
		runtime.LogLine{Time: t0.Add(2 * time.Second), Stream: "stdout", Line: "three"})
	return b
}

func TestHandler_AllocationLogs_Cases(t *testing.T) {
	c := newRawClient(t, apitest.Serve(t, logsBackend(t), api.Options{}))
	for _, tc := range []struct {
		name, path string
		status     int
		body       string
	}{
		{"all lines", "/v1/allocations/e1/logs", 200,
			`{"time":"2026-01-02T03:04:05Z","stream":"stdout","line":"one"}` + "\n" +
				`{"time":"2026-01-02T03:04:06Z","stream":"stderr","line":"two"}` + "\n" +
				`{"time":"2026-01-02T03:04:07Z","stream":"stdout","line":"three"}` + "\n"},
		{"tail", "/v1/allocations/e1/logs?tail=1", 200, `{"time":"2026-01-02T03:04:07Z","stream":"stdout","line":"three"}` + "\n"},
		{"tail 0", "/v1/allocations/e1/logs?tail=0", 200, ""},
		{"unknown allocation", "/v1/allocations/nope/logs", 404, `{"error":"allocation \"nope\" not found"}` + "\n"},
		{"attached allocation", "/v1/allocations/a1/logs", 404, `{"error":"allocation \"a1\" has no logs: it is attached"}` + "\n"},
		{"negative tail", "/v1/allocations/e1/logs?tail=-1", 400, `{"error":"tail: \"-1\": want a whole number of lines, 0 or more"}` + "\n"},
		{"bad tail", "/v1/allocations/e1/logs?tail=x", 400, `{"error":"tail: \"x\": want a whole number of lines, 0 or more"}` + "\n"},
		{"bad follow", "/v1/allocations/e1/logs?follow=maybe", 400, `{"error":"follow: \"maybe\": want true or false"}` + "\n"},
		{"unknown parameter", "/v1/allocations/e1/logs?lines=3", 400, `{"error":"unknown query parameter \"lines\" (known: follow, tail)"}` + "\n"},
		{"follow unknown allocation", "/v1/allocations/nope/logs?follow=true", 404, `{"error":"allocation \"nope\" not found"}` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.do("GET", tc.path, "")
			if r.status != tc.status || r.body != tc.body {
				t.Errorf("GET %s = %d %q\nwant %d %q", tc.path, r.status, r.body, tc.status, tc.body)
			}
			if tc.status == 200 && r.header.Get("Content-Type") != "application/x-ndjson" {
				t.Errorf("Content-Type %q", r.header.Get("Content-Type"))
			}
		})
	}
}

func TestClient_AllocationLogs_TailAndFollow(t *testing.T) {
	defer leakcheck.Check(t)()
	b := logsBackend(t)
	t.Run("client", func(t *testing.T) {
		c := newClient(t, apitest.Serve(t, b, api.Options{}))
		var got []string
		collect := func(l runtime.LogLine) error { got = append(got, l.Stream+":"+l.Line); return nil }
		if err := c.AllocationLogs(context.Background(), "e1", runtime.LogsQuery{Tail: 2}, collect); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0] != "stderr:two" || got[1] != "stdout:three" {
			t.Errorf("tail 2 = %q", got)
		}
		err := c.AllocationLogs(context.Background(), "a1", runtime.LogsQuery{Tail: -1}, collect)
		if !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("attached: %v, want ErrNotFound", err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		lines := make(chan string, 10)
		errc := make(chan error, 1)
		go func() {
			errc <- c.AllocationLogs(ctx, "e1", runtime.LogsQuery{Tail: 0, Follow: true}, func(l runtime.LogLine) error {
				lines <- l.Line
				return nil
			})
		}()
		waitFor(t, "the follow in place", func() bool { return b.Following("e1") == 1 })
		b.AppendLogs("e1", runtime.LogLine{Time: time.Now(), Stream: "stdout", Line: "four"})
		select {
		case l := <-lines:
			if l != "four" {
				t.Errorf("followed line %q, want four (tail 0 gives no old line)", l)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no followed line")
		}
		if err := b.DeregisterAllocation(context.Background(), "e1"); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, api.ErrStreamEnded) {
				t.Errorf("follow after deregistration: %v, want ErrStreamEnded", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the follow did not end with the allocation")
		}
	})
}
