package proc

import "errors"

var (
	// ErrClosed is returned by Launcher.Start after Close.
	ErrClosed = errors.New("proc: launcher closed")
	// ErrInvalidSpec is returned by Launcher.Start for a Spec without a
	// command or an output directory.
	ErrInvalidSpec = errors.New("proc: invalid process spec")
	// ErrNotExited is returned by Stop when the process did not exit even
	// after SIGKILL before the context ended.
	ErrNotExited = errors.New("proc: process did not exit")
	// ErrNotAdopted is returned by Adopt when the recorded processes are
	// not there to adopt (gone, or their PIDs now belong to others); the
	// message says which.
	ErrNotAdopted = errors.New("proc: cannot adopt")
)
