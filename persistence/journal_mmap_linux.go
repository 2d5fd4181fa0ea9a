package persistence

import (
	"errors"
	"os"
	"syscall"
)

// mmapJournal is true: journal segments are preallocated and mapped.
const mmapJournal = true

// madvPopulateRead is MADV_POPULATE_READ (Linux 5.14): fault the pages of
// a range in, as reads, without touching them.
const madvPopulateRead = 22

// errNoPreallocate is preallocate's error where the file system cannot
// preallocate.
var errNoPreallocate = errors.New("file system cannot preallocate")

// preallocate sets f's size to n with every block allocated (fallocate),
// so that writes through a mapping never need a block the disk lacks.
func preallocate(f *os.File, n int64) error {
	serr, err := fdCall(f, func(fd int) error { return syscall.Fallocate(fd, 0, 0, n) })
	if err != nil {
		return err
	}
	switch serr {
	case nil:
		return nil
	case syscall.EOPNOTSUPP, syscall.ENOSYS:
		return errNoPreallocate
	}
	return &os.PathError{Op: "fallocate", Path: f.Name(), Err: serr}
}

// mapFile maps the first n bytes of f, shared and writable.
func mapFile(f *os.File, n int64) ([]byte, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var data []byte
	var merr error
	if err := rc.Control(func(fd uintptr) {
		data, merr = syscall.Mmap(int(fd), 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	}); err != nil {
		return nil, err
	}
	if merr != nil {
		return nil, &os.PathError{Op: "mmap", Path: f.Name(), Err: merr}
	}
	return data, nil
}

func unmapFile(data []byte) error { return syscall.Munmap(data) }

// populate faults the pages of data in, best effort: a kernel without
// MADV_POPULATE_READ leaves them to fault on first write.
func populate(data []byte) {
	if len(data) > 0 {
		_ = syscall.Madvise(data, madvPopulateRead)
	}
}
