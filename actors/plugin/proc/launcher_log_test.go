package proc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestLogLine_StructuredAndPlain(t *testing.T) {
	tests := []struct {
		name, line string
		want       []string // substrings of the agent's JSON log line
		notWant    []string
	}{
		{"plain text", "hello world", []string{`"msg":"hello world"`, `"level":"info"`, `"alloc":"a1"`}, nil},
		{"logrus json", `{"level":"warning","msg":"disk slow","time":"2026-01-01T00:00:00Z","volume":"v1"}`,
			[]string{`"msg":"disk slow"`, `"level":"warning"`, `"plugin.volume":"v1"`, `"alloc":"a1"`}, []string{`"plugin.time"`}},
		{"fields cannot replace the agent's", `{"level":"info","msg":"x","alloc":"evil"}`,
			[]string{`"alloc":"a1"`, `"plugin.alloc":"evil"`}, nil},
		{"fatal is capped at error", `{"level":"fatal","msg":"boom"}`, []string{`"level":"error"`, `"msg":"boom"`}, nil},
		{"json without msg stays a line", `{"a":1}`, []string{`"msg":"{\"a\":1}"`}, nil},
		{"broken json stays a line", `{"msg":`, []string{`"msg":"{\"msg\":"`}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			l := logrus.New()
			l.SetOutput(&buf)
			l.SetFormatter(&logrus.JSONFormatter{})
			l.ExitFunc = func(int) { t.Fatal("logLine made the logger exit") }
			logLine(logrus.NewEntry(l).WithField("alloc", "a1"), tt.line)
			got := buf.String()
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("log line %s lacks %s", got, w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(got, w) {
					t.Errorf("log line %s has %s", got, w)
				}
			}
		})
	}
}
