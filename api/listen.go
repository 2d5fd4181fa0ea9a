package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// ErrAddressInUse is returned by ListenUnix when another process answers on
// the socket path (another agent runs with the same data dir).
var ErrAddressInUse = errors.New("socket in use")

// ListenUnix listens on a unix socket at path for the API.
//
// The socket has mode 0600 from the moment it appears at path: it is bound
// in a fresh 0700 directory beside path, chmodded, then renamed into place,
// so no other user can connect in between whatever the umask. (When that
// temporary path would exceed the unix socket limit it is bound at path
// under a 0177 umask instead.) A stale socket file nobody answers on is
// replaced; a live one is ErrAddressInUse; a file that is not a socket is
// left alone and is an error. The parent directory is created (0700) if
// missing. Closing the listener removes the socket file.
func ListenUnix(path string) (net.Listener, error) {
	if err := runtime.ValidateSocketPath("api.socket", path); err != nil {
		return nil, err
	}
	if err := checkStale(path); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	tmpDir, err := os.MkdirTemp(dir, ".api")
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	var ul *net.UnixListener
	if len(tmp) <= runtime.MaxSocketPathLength {
		ul, err = listenAt(tmp)
		if err == nil {
			if err = os.Rename(tmp, path); err != nil {
				ul.Close()
				return nil, fmt.Errorf("api socket: %w", err)
			}
		}
	} else {
		ul, err = listenUmask(path)
	}
	if err != nil {
		return nil, err
	}
	ul.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		ul.Close()
		return nil, fmt.Errorf("api socket: %w", err)
	}
	return &unixListener{UnixListener: ul, path: path, fi: fi}, nil
}

// listenAt binds a socket at path and makes it 0600 before anyone can
// reach it (path's directory is private to us).
func listenAt(path string) (*net.UnixListener, error) {
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ul.Close()
		return nil, fmt.Errorf("api socket: %w", err)
	}
	return ul, nil
}

// umaskMu serializes the umask change of listenUmask within this process.
var umaskMu sync.Mutex

// listenUmask binds at path with the umask set so that the socket is
// created 0600. The umask is process-wide: files other goroutines create
// in that instant get no group or other permissions, which is safe.
func listenUmask(path string) (*net.UnixListener, error) {
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ul.Close()
		return nil, fmt.Errorf("api socket: %w", err)
	}
	return ul, nil
}

// checkStale removes a socket at path that nobody answers on.
func checkStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("api socket: %w", err)
	case fi.Mode()&fs.ModeSocket == 0:
		return fmt.Errorf("api socket: %s exists and is not a socket; not removing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: another process answers on %s (is another agent running with this data dir?)", ErrAddressInUse, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("api socket: probe existing socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("api socket: remove stale socket: %w", err)
	}
	return nil
}

// unixListener removes its socket file on Close, unless something else
// has replaced it since.
type unixListener struct {
	*net.UnixListener
	path string
	fi   fs.FileInfo
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.fi) {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// ReadTokenFile reads an API token from path: the file's contents without
// surrounding white space. The file must not be readable by group or
// others, and must not be empty. Errors never include the token.
func ReadTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s: mode %04o lets group or others read it; chmod 600 it", path, fi.Mode().Perm())
	}
	if fi.Size() > 4096 {
		return "", fmt.Errorf("token file %s: larger than 4096 bytes", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s: the token must be one line without spaces", path)
	}
	return tok, nil
}
