package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func TestEvents_Table(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "events")
	r.want(t, 0, "")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 7 {
		t.Fatalf("got %d lines, want a header and 6 events:\n%s", len(lines), r.stdout)
	}
	if want := "TIME                  TYPE                      PLUGIN            ALLOC             VOLUME            MESSAGE"; lines[0] != want {
		t.Errorf("header %q\nwant   %q", lines[0], want)
	}
	if want := "2026-03-04T05:06:07Z  health-changed            nfs               nfs-node          -                 unhealthy: probe: connection refused"; lines[3] != want {
		t.Errorf("line %q\nwant %q", lines[3], want)
	}
}

func TestEvents_JSON_NDJSON(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "events", "-json")
	r.want(t, 0, "")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d lines:\n%s", len(lines), r.stdout)
	}
	if want := `{"time":"2026-03-04T05:06:07Z","type":"allocation-registered","plugin":"hostpath","alloc":"hp1","message":"registered monolith"}`; lines[0] != want {
		t.Errorf("line %s\nwant %s", lines[0], want)
	}
	for _, l := range lines {
		var ev runtime.Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Errorf("line %q: %v", l, err)
		}
	}
}

func TestEvents_Empty(t *testing.T) {
	_, env := fakeAgent(t)
	runCLI(t, env, "events").want(t, 0, "")
	runCLI(t, env, "events", "extra").want(t, 2, "")
}

// events -follow prints the backlog, then new events, and exits 0 when
// interrupted, leaving no goroutine behind on either side.
func TestEvents_Follow_InterruptExits0(t *testing.T) {
	defer leakcheck.Check(t)()
	t.Run("follow", func(t *testing.T) {
		b, env := populated(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stdout, stderr, done := startCLI(ctx, t, env, nil, "events", "-follow")
		waitFor(t, "the backlog", func() bool { return strings.Contains(stdout.String(), "claim-published") })
		waitFor(t, "the subscription", func() bool { return b.Subscribers() == 1 })
		b.Publish(runtime.Event{Time: time.Date(2026, 3, 4, 5, 6, 8, 0, time.UTC), Type: runtime.EventClaimReleased, Alloc: "web-1", Volume: "vol1", Message: "released"})
		waitFor(t, "the new event", func() bool {
			return strings.Contains(stdout.String(), "2026-03-04T05:06:08Z  claim-released            -                 web-1             vol1              released\n")
		})
		cancel()
		if code := exitCode(t, done); code != 0 {
			t.Errorf("exit code %d, stderr %s", code, stderr.String())
		}
		waitFor(t, "the server to drop the subscription", func() bool { return b.Subscribers() == 0 })
	})
}

// When the agent ends the stream, -follow fails with exit code 1.
func TestEvents_Follow_AgentGone(t *testing.T) {
	b, env := fakeAgent(t)
	b.FailWith("Subscribe", runtime.ErrShutdown)
	r := runCLI(t, env, "events", "-follow")
	r.want(t, 1, "")
	r.contains(t, "stderr", "csiactor: runtime shutting down")
}
