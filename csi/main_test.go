package csi

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// testCtx bounds a test's waits so that a bug fails the test instead of
// hanging it; no assertion depends on it.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startPlugin serves a fake plugin and dials it; both are closed when t
// ends.
func startPlugin(t testing.TB, cfg fakeplugin.Config, opts ...Option) (*fakeplugin.Plugin, Client) {
	t.Helper()
	p, ep := fakeplugin.Start(t, cfg)
	c, err := Dial(testCtx(t), ep, opts...)
	if err != nil {
		t.Fatalf("Dial: %s", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return p, c
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// debugLogger returns a debug-level logger writing to a buffer in the given
// format ("text" or "json").
func debugLogger(format string) (*logrus.Entry, *syncBuffer) {
	buf := &syncBuffer{}
	l := logrus.New()
	l.SetOutput(buf)
	l.SetLevel(logrus.DebugLevel)
	if format == "json" {
		l.SetFormatter(&logrus.JSONFormatter{})
	} else {
		l.SetFormatter(&logrus.TextFormatter{DisableColors: true})
	}
	return logrus.NewEntry(l), buf
}
