package proc

import (
	"fmt"
	"os"

	"github.com/sirupsen/logrus"
)

// Sink appends lines to the output files of a plugin whose output does
// not come through a log shim (a container engine keeps a container's
// output, and the agent copies it here), and logs each line as a shim's
// are logged. It is not safe for concurrent use.
type Sink struct {
	r   *rotator
	log *logrus.Entry
}

// OpenSink opens the output files in dir (created with mode 0700 if
// missing) for appending. log receives each line (field "stream"); nil
// discards them.
func OpenSink(dir string, log *logrus.Entry) (*Sink, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open output: %w", err)
	}
	r, err := openRotator(dir, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("open output: %w", err)
	}
	return &Sink{r: r, log: log}, nil
}

// Write appends l (a text longer than 64 KiB as several records) and logs
// it.
func (s *Sink) Write(l Line) error {
	text := l.Text
	for {
		part := text
		if len(part) > maxLine {
			part = part[:maxLine]
		}
		if err := s.r.write(Line{Time: l.Time, Stream: l.Stream, Text: part}.format()); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		text = text[len(part):]
		if text == "" {
			break
		}
	}
	if s.log != nil {
		logLine(s.log.WithField("stream", l.Stream), l.Text)
	}
	return nil
}

// Close closes the output file.
func (s *Sink) Close() error { return s.r.close() }
