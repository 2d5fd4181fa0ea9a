package proc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/csiactor/csiactor/internal/atomicfile"
)

// StateFile is the name of the file, in a plugin's output directory, that
// identifies its running processes for the next agent.
const StateFile = "process.json"

// State identifies the processes of a running plugin across agent
// restarts: each by its PID and its start time in clock ticks after boot
// (from /proc/<pid>/stat), so that a process that merely reuses a PID is
// never taken for it.
type State struct {
	PID          int    `json:"pid"`
	PIDStart     uint64 `json:"pid_start"`
	ShimPID      int    `json:"shim_pid"`
	ShimPIDStart uint64 `json:"shim_pid_start"`
}

// WriteState writes st to dir/process.json, atomically (a new file renamed
// over the old one) and synced, so that an agent killed at any moment
// leaves either the old state or the new one.
func WriteState(dir string, st State) error {
	b, err := json.Marshal(st)
	if err == nil {
		err = atomicfile.Write(filepath.Join(dir, StateFile), b)
	}
	if err != nil {
		return fmt.Errorf("write process state: %w", err)
	}
	return nil
}

// ReadState reads dir/process.json; a missing file is the zero State.
func ReadState(dir string) (State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("read process state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, fmt.Errorf("read process state %s: %w", filepath.Join(dir, StateFile), err)
	}
	return st, nil
}

// RemoveState removes dir/process.json.
func RemoveState(dir string) error {
	if err := os.Remove(filepath.Join(dir, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove process state: %w", err)
	}
	return nil
}

// PositionFile is the name of the file, in a plugin's output directory,
// that records how far the agent that detached from the plugin had logged
// its output (see Process.Detach): the next agent goes on from there.
const PositionFile = "forwarded.json"

// position is a place in a plugin's output: an offset in the output file
// with that inode, whichever name (output.log, output.log.N) it has now.
// The zero position is before the first record of the oldest file.
type position struct {
	Inode  uint64 `json:"inode"`
	Offset int64  `json:"offset"`
}

func writePosition(dir string, pos position) error {
	b, err := json.Marshal(pos)
	if err == nil {
		err = atomicfile.Write(filepath.Join(dir, PositionFile), b)
	}
	if err != nil {
		return fmt.Errorf("record how far the plugin's output was logged: %w", err)
	}
	return nil
}

// takePosition reads and removes dir/forwarded.json. ok reports whether
// pos was read; err tells of a broken file, or one that could not be
// removed (then a later agent might log some lines again).
func takePosition(dir string) (pos position, ok bool, err error) {
	path := filepath.Join(dir, PositionFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return position{}, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &pos)
		ok = err == nil
	}
	if rerr := os.Remove(path); err == nil && rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if err != nil {
		err = fmt.Errorf("take how far the previous agent logged the plugin's output, from %s: %w", path, err)
	}
	return pos, ok, err
}
