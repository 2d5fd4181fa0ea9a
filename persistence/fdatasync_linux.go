package persistence

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data, and the metadata needed to read it back
// (its size), to disk.
func fdatasync(f *os.File) error {
	serr, err := fdCall(f, syscall.Fdatasync)
	if err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// fdCall runs call on f's descriptor, again while it fails with EINTR,
// and returns its error as serr; err is a failure to reach the descriptor.
func fdCall(f *os.File, call func(fd int) error) (serr, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	err = rc.Control(func(fd uintptr) {
		for {
			serr = call(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	})
	return serr, err
}
