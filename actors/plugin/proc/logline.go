package proc

import (
	"encoding/json"
	"strings"

	"github.com/sirupsen/logrus"
)

// logLine writes one line of a plugin's output. A JSON object with a "msg"
// (or "message") field, as logrus, slog and zap write, is logged at its
// "level" with its other fields prefixed "plugin." (so they cannot replace
// the agent's own fields such as alloc); anything else is logged as it is,
// at info.
func logLine(log *logrus.Entry, line string) {
	if len(line) < 2 || line[0] != '{' {
		log.Info(line)
		return
	}
	var obj map[string]any
	if json.Unmarshal([]byte(line), &obj) != nil {
		log.Info(line)
		return
	}
	msg, ok := obj["msg"].(string)
	if !ok {
		if msg, ok = obj["message"].(string); !ok {
			log.Info(line)
			return
		}
	}
	level := logrus.InfoLevel
	if s, ok := obj["level"].(string); ok {
		if l, err := logrus.ParseLevel(strings.ToLower(s)); err == nil {
			level = l
		}
	}
	if level < logrus.ErrorLevel {
		level = logrus.ErrorLevel // a plugin never stops the agent with fatal or panic
	}
	fields := make(logrus.Fields, len(obj))
	for k, v := range obj {
		switch k {
		case "msg", "message", "level", "time", "ts":
			continue
		}
		fields["plugin."+k] = v
	}
	log.WithFields(fields).Log(level, msg)
}
