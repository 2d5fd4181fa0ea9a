package actorkit

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

func newTestLogger(level logrus.Level) (*logrus.Entry, *test.Hook) {
	l, hook := test.NewNullLogger()
	l.SetLevel(level)
	return logrus.NewEntry(l), hook
}

func TestSlogHandler_Handle_Levels(t *testing.T) {
	tests := []struct {
		name string
		in   slog.Level
		want logrus.Level
	}{
		{"error", slog.LevelError, logrus.ErrorLevel},
		{"above error", slog.LevelError + 4, logrus.ErrorLevel},
		{"warn", slog.LevelWarn, logrus.WarnLevel},
		{"info", slog.LevelInfo, logrus.InfoLevel},
		{"debug", slog.LevelDebug, logrus.DebugLevel},
		{"below debug", slog.LevelDebug - 4, logrus.TraceLevel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entry, hook := newTestLogger(logrus.TraceLevel)
			slog.New(NewSlogHandler(entry)).Log(context.Background(), tt.in, "hello")
			e := hook.LastEntry()
			if e == nil {
				t.Fatal("no log entry written")
			}
			if e.Level != tt.want || e.Message != "hello" {
				t.Errorf("got level %s message %q, want level %s message %q", e.Level, e.Message, tt.want, "hello")
			}
		})
	}
}

func TestSlogHandler_Enabled_FollowsLogrusLevel(t *testing.T) {
	entry, hook := newTestLogger(logrus.InfoLevel)
	log := slog.New(NewSlogHandler(entry))
	log.Debug("hidden")
	log.Info("shown")
	if n := len(hook.AllEntries()); n != 1 {
		t.Fatalf("got %d entries, want 1 (debug must be filtered)", n)
	}
	if log.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("Enabled(debug) = true with logrus at info")
	}
}

func TestSlogHandler_Handle_AttrsBecomeFields(t *testing.T) {
	entry, hook := newTestLogger(logrus.InfoLevel)
	entry = entry.WithField("base", "kept")
	log := slog.New(NewSlogHandler(entry)).With("sys", "s1").WithGroup("g").With("inner", 1)
	log.Info("msg", "n", 42, slog.Group("sub", "k", "v"), "err", errors.New("boom"), slog.Attr{})
	e := hook.LastEntry()
	if e == nil {
		t.Fatal("no entry")
	}
	want := map[string]any{
		"base":    "kept",
		"sys":     "s1",
		"g.inner": int64(1),
		"g.n":     int64(42),
		"g.sub.k": "v",
		"g.err":   "boom",
	}
	for k, v := range want {
		if got, ok := e.Data[k]; !ok || got != v {
			t.Errorf("field %q = %#v (present %v), want %#v", k, got, ok, v)
		}
	}
	if len(e.Data) != len(want) {
		t.Errorf("got fields %v, want exactly %v", e.Data, want)
	}
}

func TestNewSystem_LogsThroughLogrus(t *testing.T) {
	entry, hook := newTestLogger(logrus.InfoLevel)
	sys := NewSystem(entry)
	defer sys.Shutdown()
	var found bool
	for _, e := range hook.AllEntries() {
		if e.Message == "actor system started" && e.Data["lib"] == "protoactor" && e.Data["actor_system"] == sys.ID {
			found = true
		}
	}
	if !found {
		t.Fatalf("protoactor's start message did not reach logrus with lib and actor_system fields; got %d entries", len(hook.AllEntries()))
	}
	if sys.Config.MetricsProvider != nil {
		t.Error("built-in metrics must be off")
	}
}
