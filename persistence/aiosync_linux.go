//go:build linux && (amd64 || arm64)

package persistence

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// aioSyncer flushes a file's data as fdatasync(2) does, through Linux AIO
// (IOCB_CMD_FDSYNC, Linux 4.18 and later), and waits for the completion on
// an eventfd that the Go runtime's network poller watches.
//
// Why: a goroutine in a blocking fdatasync keeps its P (the runtime's slot
// for running Go code) for the whole call. The runtime's monitor hands
// such a P to another thread only when it sees the same call on two of
// its ticks, and once it has backed off it ticks every 10 ms: calls of
// about 200 µs, back to back, are never taken over. Under load the
// journal commits one group after another, so one of two Ps sat in
// fdatasync nearly all the time, and a thousand volumes claiming at once
// used 1.3 of 2 cores. With the sync done by the kernel's AIO worker, the
// waiting goroutine parks and its P runs other goroutines.
//
// The durability is fdatasync's: the kernel's AIO fdsync calls the same
// file operation (vfs_fsync with datasync set) and reports its result in
// the completion event.
type aioSyncer struct {
	mu  sync.Mutex // one sync at a time: they share the eventfd's count and the event
	ctx uintptr    // the aio_context_t
	efd *os.File   // the eventfd the completions signal; non-blocking, in the poller
	// efdNum is efd's descriptor, taken before os.NewFile: efd.Fd would
	// put it in blocking mode, and a read would then hold the P again.
	efdNum uint32
	cb     aioCB    // guarded by mu
	ev     aioEvent // guarded by mu
}

// aioCB is struct iocb of <linux/aio_abi.h> on a little-endian 64-bit
// host.
type aioCB struct {
	data      uint64
	key       uint32
	rwFlags   int32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// aioEvent is struct io_event of <linux/aio_abi.h>.
type aioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

const (
	aioCmdFdsync  = 3      // IOCB_CMD_FDSYNC
	aioFlagResfd  = 1 << 0 // IOCB_FLAG_RESFD: signal aio_resfd on completion
	aioMaxPending = 1      // io_setup's nr_events: one sync at a time
)

// errAIOUnsupported reports that a sync could not be done through AIO
// (the kernel or the file system refuses it, or its completion was lost);
// the caller syncs with fdatasync instead.
var errAIOUnsupported = errors.New("fdatasync through AIO is not supported here")

// newAIOSyncer sets up an AIO context and its eventfd. It fails where AIO
// is not available (an old kernel, a sandbox that forbids io_setup, the
// system's aio-max-nr reached); the caller then uses fdatasync.
func newAIOSyncer() (*aioSyncer, error) {
	var ctx uintptr
	if _, _, e := syscall.Syscall(syscall.SYS_IO_SETUP, aioMaxPending, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil, os.NewSyscallError("io_setup", e)
	}
	fd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		_, _, _ = syscall.Syscall(syscall.SYS_IO_DESTROY, ctx, 0, 0)
		return nil, os.NewSyscallError("eventfd2", e)
	}
	// A non-blocking descriptor: os.NewFile puts it in the poller, so a
	// Read that would block parks the goroutine.
	return &aioSyncer{ctx: ctx, efd: os.NewFile(fd, "csiactor-journal-sync"), efdNum: uint32(fd)}, nil
}

// sync flushes f's data. An error wrapping errAIOUnsupported means the
// AIO machinery itself failed (the kernel refused the request, or its
// completion could not be had), not the sync: the caller then syncs with
// fdatasync, which gives the definite answer, and stops using a. Any other
// error is the sync's own, as fdatasync would report it.
func (a *aioSyncer) sync(f *os.File) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	serr, err := fdCall(f, a.submit)
	switch {
	case err != nil:
		return err // f's descriptor cannot be had (f is closed)
	case serr != nil:
		return fmt.Errorf("%w: io_submit: %w", errAIOUnsupported, serr)
	}
	// The sync is in flight. Its completion is reaped whatever happens;
	// if it cannot be, the caller drops a (io_destroy waits for it).
	var count [8]byte
	_, rerr := io.ReadFull(a.efd, count[:])
	res, gerr := a.reap(rerr != nil)
	switch {
	case gerr != nil:
		return fmt.Errorf("%w: reap the completion: %w", errAIOUnsupported, gerr)
	case res < 0:
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: syscall.Errno(-res)}
	}
	return nil
}

// submit queues an fdsync of fd; called through fdCall, it is repeated on
// EINTR.
func (a *aioSyncer) submit(fd int) error {
	a.cb = aioCB{opcode: aioCmdFdsync, fildes: uint32(fd), flags: aioFlagResfd, resfd: a.efdNum}
	cbs := [1]*aioCB{&a.cb}
	n, _, e := syscall.Syscall(syscall.SYS_IO_SUBMIT, a.ctx, 1, uintptr(unsafe.Pointer(&cbs[0])))
	switch {
	case e != 0:
		return e
	case n != 1:
		return syscall.EAGAIN
	}
	return nil
}

// reap takes the completion of the sync in flight and returns its result
// (0, or a negated errno). Normally the eventfd said it is there; when
// waiting on the eventfd failed (wait), it blocks in io_getevents until it
// is.
func (a *aioSyncer) reap(wait bool) (int64, error) {
	for {
		// Each pointer becomes a uintptr in the call expression itself,
		// as unsafe.Pointer's rules require for syscall arguments.
		var n uintptr
		var e syscall.Errno
		if wait {
			n, _, e = syscall.Syscall6(syscall.SYS_IO_GETEVENTS, a.ctx, 1, 1, uintptr(unsafe.Pointer(&a.ev)), 0, 0)
		} else {
			var now syscall.Timespec // zero: do not wait
			n, _, e = syscall.Syscall6(syscall.SYS_IO_GETEVENTS, a.ctx, 1, 1, uintptr(unsafe.Pointer(&a.ev)), uintptr(unsafe.Pointer(&now)), 0)
		}
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return 0, os.NewSyscallError("io_getevents", e)
		case n == 1:
			return a.ev.res, nil
		}
		// Signalled but not there yet (it cannot be, but if so): wait.
		wait = true
	}
}

// close destroys the AIO context and closes the eventfd. No sync may be
// running.
func (a *aioSyncer) close() error {
	_, _, e := syscall.Syscall(syscall.SYS_IO_DESTROY, a.ctx, 0, 0)
	err := a.efd.Close()
	if e != 0 {
		return errors.Join(os.NewSyscallError("io_destroy", e), err)
	}
	return err
}
