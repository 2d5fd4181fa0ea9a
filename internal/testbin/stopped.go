package testbin

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// Stopped reports whether every thread of process pid is stopped (state T,
// after a SIGSTOP): kill(2) returns before the threads stop, so a test
// that needs the process to answer nothing more waits for Stopped.
func Stopped(pid int) bool {
	stats, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/stat")
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		stat, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state is the first field after the ")" that ends the
		// command name.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}
