package actorkit

import (
	"context"
	"log/slog"

	"github.com/sirupsen/logrus"
)

// SlogHandler is a [slog.Handler] that writes every record to a logrus
// entry: levels are mapped (below Debug becomes Trace), attributes become
// logrus fields, and groups prefix their keys with "group.".
//
// It is safe for concurrent use; its methods never modify the receiver.
type SlogHandler struct {
	entry  *logrus.Entry
	prefix string // group prefix, "" or "a.b."
	fields logrus.Fields
}

var _ slog.Handler = (*SlogHandler)(nil)

// NewSlogHandler returns a handler that writes to entry.
func NewSlogHandler(entry *logrus.Entry) *SlogHandler {
	return &SlogHandler{entry: entry}
}

// Level maps a slog level to the logrus level it is written at.
func Level(l slog.Level) logrus.Level {
	switch {
	case l >= slog.LevelError:
		return logrus.ErrorLevel
	case l >= slog.LevelWarn:
		return logrus.WarnLevel
	case l >= slog.LevelInfo:
		return logrus.InfoLevel
	case l >= slog.LevelDebug:
		return logrus.DebugLevel
	default:
		return logrus.TraceLevel
	}
}

// Enabled reports whether the logrus logger writes records of level l.
func (h *SlogHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.entry.Logger.IsLevelEnabled(Level(l))
}

// Handle writes r to the logrus entry.
func (h *SlogHandler) Handle(_ context.Context, r slog.Record) error {
	fields := make(logrus.Fields, len(h.fields)+r.NumAttrs())
	for k, v := range h.fields {
		fields[k] = v
	}
	r.Attrs(func(a slog.Attr) bool {
		addAttr(fields, h.prefix, a)
		return true
	})
	e := h.entry.WithFields(fields)
	if !r.Time.IsZero() {
		e = e.WithTime(r.Time)
	}
	e.Log(Level(r.Level), r.Message)
	return nil
}

// WithAttrs returns a handler that adds attrs to every record.
func (h *SlogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	fields := make(logrus.Fields, len(h.fields)+len(attrs))
	for k, v := range h.fields {
		fields[k] = v
	}
	for _, a := range attrs {
		addAttr(fields, h.prefix, a)
	}
	return &SlogHandler{entry: h.entry, prefix: h.prefix, fields: fields}
}

// WithGroup returns a handler that prefixes later attribute keys with name.
func (h *SlogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &SlogHandler{entry: h.entry, prefix: h.prefix + name + ".", fields: h.fields}
}

func addAttr(fields logrus.Fields, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p = prefix + a.Key + "."
		}
		for _, ga := range v.Group() {
			addAttr(fields, p, ga)
		}
		return
	}
	key := prefix + a.Key
	if key == "" {
		return
	}
	switch v.Kind() {
	case slog.KindAny:
		x := v.Any()
		if err, ok := x.(error); ok {
			fields[key] = err.Error()
			return
		}
		fields[key] = x
	case slog.KindString:
		fields[key] = v.String()
	default:
		fields[key] = v.Any()
	}
}
