package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// Stat is what csiactor reads from /proc/<pid>/stat.
type Stat struct {
	PID int
	// State is the one-letter process state ("R", "S", "Z", ...).
	State string
	// PGID is the process group.
	PGID int
	// StartTicks is the start time after boot in clock ticks; with the PID
	// it identifies a process across PID reuse.
	StartTicks uint64
}

// ErrNoProcess is returned by ReadStat when no process has the PID.
var ErrNoProcess = errors.New("proc: no such process")

// ReadStat reads /proc/<pid>/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return Stat{}, fmt.Errorf("%w: %d", ErrNoProcess, pid)
	}
	if err != nil {
		return Stat{}, fmt.Errorf("read process stat: %w", err)
	}
	return parseStat(pid, b)
}

// parseStat parses the content of /proc/<pid>/stat. The command name
// (field 2) is in parentheses and may itself contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(pid int, b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: %d fields after the command name, want at least 20", pid, len(f))
	}
	pgid, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: pgrp: %w", pid, err)
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: starttime: %w", pid, err)
	}
	return Stat{PID: pid, State: string(f[0]), PGID: pgid, StartTicks: start}, nil
}
