package proc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, StateFile+".tmp*")
	if err != nil {
		return fmt.Errorf("write process state: %w", err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, StateFile))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
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
