package csiplugin

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
)

// fuseDevice is the FUSE device the kernel serves mounts through.
const fuseDevice = "/dev/fuse"

// fuseServerEndWait bounds how long unstage waits for the loop of a FUSE
// server to return once the last mount of it in this mount namespace is
// gone. The loop returns at once unless another namespace still holds the
// mount; the wait only keeps unstage from blocking on such a copy.
const fuseServerEndWait = 5 * time.Second

// errDeadMountRefused is what unpublish and unstage answer, with
// Config.FUSEFailDeadUnmount, for a path that holds a dead FUSE mount.
var errDeadMountRefused = errors.New("is a dead FUSE mount; not unmounting it (fuse_fail_dead_unmount is set)")

// checkFUSE reports why this process cannot serve FUSE mounts: it must be
// root, to mount(2) without fusermount, and open the FUSE device.
func checkFUSE() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("%w: fuse needs root to mount through %s without fusermount; this process runs as uid %d", ErrInvalidConfig, fuseDevice, uid)
	}
	f, err := os.OpenFile(fuseDevice, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: fuse: %w", ErrInvalidConfig, err)
	}
	return f.Close()
}

// isCorruptedMount reports whether err, from a stat of a mount point, says
// the file system behind it is gone: ENOTCONN (a FUSE server that died),
// EIO or ESTALE. Such a mount stays in the mount table and must be
// unmounted before its path can be used again.
func isCorruptedMount(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ESTALE)
}

// corrupted reports whether path is a mount point whose file system is
// gone (see isCorruptedMount), and the error that says so.
func (m bindMounter) corrupted(path string) (bool, error) {
	n, err := mountCount(m.mountinfo, path)
	if err != nil || n == 0 {
		return false, err
	}
	var st syscall.Stat_t
	serr := syscall.Stat(path, &st)
	return isCorruptedMount(serr), serr
}

// fuseMounter serves each staging through FUSE from this process: the
// loopback file system of go-fuse over the volume directory, mounted with
// mount(2) (no fusermount). Targets are bind mounts of the staging, so a
// dead staging makes its targets fail too. A mount this process does not
// serve (left by an earlier process of the plugin) is dead: stage and
// publish unmount it and mount anew, unstage and unpublish unmount it.
//
// When the process exits its FUSE mounts stay in the mount table and every
// access to them fails with ENOTCONN, as they do when a FUSE driver dies.
type fuseMounter struct {
	bind bindMounter
	log  *logrus.Entry
	// failDeadUnmount makes unpublish and unstage fail on a dead mount
	// (Config.FUSEFailDeadUnmount).
	failDeadUnmount bool

	mu      sync.Mutex
	servers map[string]*fuseServer // guarded by mu: by staging path
	// lingering are the servers of unstaged volumes whose loop had not
	// returned when unstage stopped waiting (another mount namespace holds
	// a copy of the mount). Guarded by mu.
	lingering []*fuseServer
	// closed is set by close: a stage still running after Stop (an RPC
	// that outlived the graceful stop) must not start a server. Guarded by
	// mu.
	closed bool
}

// fuseServer is one FUSE mount served by this process.
type fuseServer struct {
	srv *fuse.Server
	// dev is the mount's device number, major:minor, as in mountinfo.
	dev string
	// done is closed when the server's loop has returned: when the kernel
	// drops the connection, once the last mount of it is gone.
	done chan struct{}
}

func newFUSEMounter(mountinfo string, log *logrus.Entry, failDeadUnmount bool) *fuseMounter {
	return &fuseMounter{
		bind:            bindMounter{mountinfo: mountinfo},
		log:             log,
		failDeadUnmount: failDeadUnmount,
		servers:         map[string]*fuseServer{},
	}
}

func (m *fuseMounter) stage(volDir, staging string, flags uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrStopped
	}
	if s := m.servers[staging]; s != nil {
		n, err := mountCount(m.bind.mountinfo, staging)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil // served by this process: a repeat
		}
		delete(m.servers, staging) // unmounted behind our back
	}
	// Whatever is mounted here is not served by this process: a dead FUSE
	// mount of an earlier one, or something else. Unmount it and mount anew.
	if dead, serr := m.bind.corrupted(staging); dead {
		m.log.WithField("error", serr.Error()).Warn("staging path holds a dead FUSE mount; unmounting it")
	}
	if err := m.bind.unmountAll(staging); err != nil {
		return err
	}
	root, err := fs.NewLoopbackRoot(volDir)
	if err != nil {
		return fmt.Errorf("fuse: volume directory: %w", err)
	}
	srv, err := fuse.NewServer(fs.NewNodeFS(root, &fs.Options{}), staging, &fuse.MountOptions{
		DirectMountStrict: true, // mount(2) ourselves; no fusermount
		DirectMountFlags:  syscall.MS_NOSUID | syscall.MS_NODEV | flags,
		AllowOther:        true, // workloads need not run as root
		Options:           []string{"default_permissions"},
		FsName:            volDir,
		Name:              "csiplugin",
	})
	if err != nil {
		return fmt.Errorf("fuse mount: %w", err)
	}
	s := &fuseServer{srv: srv, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		srv.Serve()
	}()
	if err := srv.WaitMount(); err != nil {
		_ = syscall.Unmount(staging, syscall.MNT_DETACH)
		<-s.done
		return fmt.Errorf("fuse mount: %w", err)
	}
	if s.dev, err = mountDev(m.bind.mountinfo, staging); err != nil {
		_ = syscall.Unmount(staging, syscall.MNT_DETACH)
		<-s.done
		return err
	}
	m.servers[staging] = s
	return nil
}

func (m *fuseMounter) unstage(staging string) error {
	s, err := m.unmountStaging(staging)
	if err != nil || s == nil {
		return err
	}
	// The kernel drops the connection, and the server's loop returns, when
	// the last mount of it goes: now, unless a target still binds it (the
	// loop then ends with that target's unpublish) or another mount
	// namespace holds a copy of it (a process that unshared its mounts
	// while the volume was staged): the loop then serves that copy until it
	// goes, as a FUSE driver does, and unstage does not wait for it.
	if n, err := devMounts(m.bind.mountinfo, s.dev); err != nil || n > 0 {
		return nil
	}
	t := time.NewTimer(fuseServerEndWait)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
		m.log.WithField("staging", staging).Warn("the FUSE file system is still mounted in another mount namespace; serving it until that mount goes")
		m.mu.Lock()
		m.lingering = append(m.lingering, s)
		m.mu.Unlock()
	}
	return nil
}

// close ends every FUSE server of this process as the process's exit
// would: it aborts each connection, so that its mounts stay in the mount
// table and every access to them fails with ENOTCONN, and waits for the
// servers' loops to return. Plugin.Stop calls it once no RPC runs.
func (m *fuseMounter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	servers := m.lingering
	for _, s := range m.servers {
		servers = append(servers, s)
	}
	m.servers, m.lingering, m.closed = map[string]*fuseServer{}, nil, true
	if len(servers) == 0 {
		return
	}
	ctl, done, err := fuseControlDir()
	if err != nil {
		m.log.WithField("error", err.Error()).Warn("cannot abort the FUSE connections; their mounts are served until the process exits")
		return
	}
	defer done()
	for _, s := range servers {
		if err := abortConnection(ctl, s); err != nil {
			m.log.WithField("error", err.Error()).Warn("cannot abort a FUSE connection; its mounts are served until the process exits")
			continue
		}
		t := time.NewTimer(fuseServerEndWait)
		select {
		case <-s.done:
		case <-t.C:
			m.log.Warn("a FUSE server did not end after its connection was aborted")
		}
		t.Stop()
	}
}

// fuseControlDir returns the directory of the FUSE control file system,
// which has a directory per connection: the usual one when it is mounted
// there, else a private mount of it that done removes.
func fuseControlDir() (dir string, done func(), err error) {
	const usual = "/sys/fs/fuse/connections"
	var st syscall.Statfs_t
	if err := syscall.Statfs(usual, &st); err == nil && st.Type == fusectlSuperMagic {
		return usual, func() {}, nil
	}
	dir, err = os.MkdirTemp("", "csiplugin-fusectl-")
	if err != nil {
		return "", nil, fmt.Errorf("fuse control file system: %w", err)
	}
	if err := syscall.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("mount the fuse control file system: %w", err)
	}
	return dir, func() {
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		_ = os.Remove(dir)
	}, nil
}

// fusectlSuperMagic is the f_type of the FUSE control file system
// (FUSE_CTL_SUPER_MAGIC in linux/magic.h).
const fusectlSuperMagic = 0x65735543

// abortConnection aborts the connection of s through the control file
// system at ctl: it is named by the device number of the mount, the
// kernel's dev_t (major << 20 | minor). A connection already gone (its
// directory too) is not an error.
func abortConnection(ctl string, s *fuseServer) error {
	var major, minor uint64
	if _, err := fmt.Sscanf(s.dev, "%d:%d", &major, &minor); err != nil {
		return fmt.Errorf("device number %q: %w", s.dev, err)
	}
	abort := filepath.Join(ctl, strconv.FormatUint(major<<20|minor, 10), "abort")
	if err := os.WriteFile(abort, []byte("1"), 0); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("abort the FUSE connection: %w", err)
	}
	return nil
}

// unmountStaging unmounts staging and forgets its server, which it
// returns: nil when this process did not serve it.
func (m *fuseMounter) unmountStaging(staging string) (*fuseServer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.servers[staging]
	if s == nil {
		if err := m.refuseDead(staging); err != nil {
			return nil, err
		}
		return nil, m.bind.unmountAll(staging)
	}
	if err := m.bind.unmountAll(staging); err != nil {
		return nil, err
	}
	delete(m.servers, staging)
	return s, nil
}

func (m *fuseMounter) publish(volDir, staging, target string, flags uintptr) error {
	if dead, serr := m.bind.corrupted(staging); dead {
		return fmt.Errorf("staging path is a dead FUSE mount (%w); stage the volume again", serr)
	}
	if dead, serr := m.bind.corrupted(target); dead {
		m.log.WithField("error", serr.Error()).Warn("target path holds a dead FUSE mount; unmounting it")
		if err := m.bind.unmountAll(target); err != nil {
			return err
		}
	}
	return m.bind.publish(volDir, staging, target, flags)
}

func (m *fuseMounter) unpublish(target string) error {
	if err := m.refuseDead(target); err != nil {
		return err
	}
	return m.bind.unpublish(target)
}

// refuseDead returns errDeadMountRefused for a dead mount at path when
// failDeadUnmount is set.
func (m *fuseMounter) refuseDead(path string) error {
	if !m.failDeadUnmount {
		return nil
	}
	if dead, _ := m.bind.corrupted(path); dead {
		return fmt.Errorf("%s %w", path, errDeadMountRefused)
	}
	return nil
}
