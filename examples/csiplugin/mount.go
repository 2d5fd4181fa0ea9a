package csiplugin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// mountFlagBits are the mount flags a volume capability may carry, and the
// MS_* bit each one sets on the bind mount. Anything else is rejected.
// Error messages and logs name a flag by its index, never by its text.
var mountFlagBits = map[string]uintptr{
	"ro":         syscall.MS_RDONLY,
	"rw":         0,
	"nosuid":     syscall.MS_NOSUID,
	"nodev":      syscall.MS_NODEV,
	"noexec":     syscall.MS_NOEXEC,
	"noatime":    syscall.MS_NOATIME,
	"nodiratime": syscall.MS_NODIRATIME,
	"relatime":   syscall.MS_RELATIME,
}

// parseMountFlags turns mount flags into MS_* bits. A flag may be a
// comma-separated list ("ro,nosuid"), as COs sometimes pass them.
func parseMountFlags(flags []string) (uintptr, error) {
	var bits uintptr
	for i, f := range flags {
		for _, one := range strings.Split(f, ",") {
			b, ok := mountFlagBits[strings.TrimSpace(one)]
			if !ok {
				return 0, fmt.Errorf("mount_flags[%d] is not a supported bind mount flag", i)
			}
			bits |= b
		}
	}
	return bits, nil
}

// mounter makes a volume directory appear at staging and target paths.
// Every method is idempotent: calling it again after success (or after a
// crash half-way) finishes the job without stacking anything.
type mounter interface {
	// stage makes volDir available at staging, an existing directory.
	stage(volDir, staging string, flags uintptr) error
	// unstage undoes stage; it leaves the staging directory itself, which
	// belongs to the CO.
	unstage(staging string) error
	// publish makes the staged volume available at target, creating it.
	publish(volDir, staging, target string, flags uintptr) error
	// unpublish undoes publish and removes target.
	unpublish(target string) error
}

// bindMounter uses bind mounts; it needs CAP_SYS_ADMIN.
type bindMounter struct {
	// mountinfo is the mount table to read; /proc/self/mountinfo.
	mountinfo string
}

func (m bindMounter) stage(volDir, staging string, flags uintptr) error {
	return m.bind(volDir, staging, flags)
}

func (m bindMounter) unstage(staging string) error {
	return m.unmountAll(staging)
}

func (m bindMounter) publish(_, staging, target string, flags uintptr) error {
	if err := mkdirTarget(target); err != nil {
		return err
	}
	return m.bind(staging, target, flags)
}

func (m bindMounter) unpublish(target string) error {
	if err := m.unmountAll(target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove target: %w", err)
	}
	return nil
}

// bind bind-mounts src onto dst unless dst is already a mount point, then
// (re)applies flags with a bind remount, which is idempotent.
func (m bindMounter) bind(src, dst string, flags uintptr) error {
	n, err := mountCount(m.mountinfo, dst)
	if err != nil {
		return err
	}
	if n == 0 {
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount: %w", err)
		}
	}
	if flags != 0 {
		if err := syscall.Mount("", dst, "", syscall.MS_BIND|syscall.MS_REMOUNT|flags, ""); err != nil {
			return fmt.Errorf("bind remount: %w", err)
		}
	}
	return nil
}

// unmountAll unmounts path until it is no longer a mount point.
func (m bindMounter) unmountAll(path string) error {
	for range 16 {
		n, err := mountCount(m.mountinfo, path)
		if err != nil || n == 0 {
			return err
		}
		if err := syscall.Unmount(path, 0); err != nil {
			if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
				return nil // raced with another unmount
			}
			return fmt.Errorf("unmount: %w", err)
		}
	}
	return fmt.Errorf("unmount: %s is still mounted after 16 unmounts", path)
}

// symlinkMounter needs no privilege: staging is bookkeeping only and the
// target becomes a symlink to the volume directory.
type symlinkMounter struct{}

func (symlinkMounter) stage(volDir, _ string, _ uintptr) error {
	if _, err := os.Stat(volDir); err != nil {
		return fmt.Errorf("volume directory: %w", err)
	}
	return nil
}

func (symlinkMounter) unstage(string) error { return nil }

func (symlinkMounter) publish(volDir, _, target string, _ uintptr) error {
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("target: %w", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		if dest, err := os.Readlink(target); err == nil && dest == volDir {
			return nil
		}
		return fmt.Errorf("target is a symlink to something else")
	case fi.IsDir():
		// The CO may have created the target directory; replace it only
		// when it is empty.
		if err := os.Remove(target); err != nil {
			return fmt.Errorf("replace target directory: %w", err)
		}
	default:
		return fmt.Errorf("target exists and is not a directory")
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return fmt.Errorf("create target parent: %w", err)
	}
	if err := os.Symlink(volDir, target); err != nil {
		return fmt.Errorf("symlink target: %w", err)
	}
	return nil
}

func (symlinkMounter) unpublish(target string) error {
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove target: %w", err)
	}
	return nil
}

// mkdirTarget creates the target directory (and missing parents); an
// existing target that is not a directory is an error (ENOTDIR).
func mkdirTarget(target string) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create target: %w", err)
	}
	return nil
}

// mountCount returns how many mounts in the mountinfo file have path as
// their mount point (more than one when mounts are stacked).
func mountCount(mountinfo, path string) (int, error) {
	want := filepath.Clean(path)
	if real, err := filepath.EvalSymlinks(want); err == nil {
		want = real
	}
	n := 0
	err := scanMounts(mountinfo, func(e mountEntry) {
		if e.point == want {
			n++
		}
	})
	return n, err
}

// mountDev returns the device number (major:minor) of the mount at path,
// the top one when mounts are stacked.
func mountDev(mountinfo, path string) (string, error) {
	path = filepath.Clean(path)
	dev := ""
	err := scanMounts(mountinfo, func(e mountEntry) {
		if e.point == path {
			dev = e.dev
		}
	})
	if err == nil && dev == "" {
		err = fmt.Errorf("read mount table: %s is not a mount point", path)
	}
	return dev, err
}

// devMounts returns how many mounts in the mountinfo file are of the file
// system with device number dev (major:minor).
func devMounts(mountinfo, dev string) (int, error) {
	n := 0
	err := scanMounts(mountinfo, func(e mountEntry) {
		if e.dev == dev {
			n++
		}
	})
	return n, err
}

// scanMounts calls fn with each mount of the mountinfo file, in order.
func scanMounts(mountinfo string, fn func(mountEntry)) error {
	f, err := os.Open(mountinfo)
	if err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	return scanMountTable(f, fn)
}

// countMountPoints counts the lines of a mountinfo table whose mount point
// (the fifth field) is path.
func countMountPoints(r io.Reader, path string) (int, error) {
	n := 0
	err := scanMountTable(r, func(e mountEntry) {
		if e.point == path {
			n++
		}
	})
	return n, err
}

// scanMountTable calls fn with each well-formed line of a mountinfo table.
func scanMountTable(r io.Reader, fn func(mountEntry)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		if e, ok := parseMountLine(sc.Text()); ok {
			fn(e)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	return nil
}

// mountEntry is what the plugin reads of one mountinfo line.
type mountEntry struct {
	dev   string // major:minor of the file system
	point string // the mount point, unescaped
}

// parseMountLine reads one mountinfo line. Fields: id, parent id,
// major:minor, root, mount point, ...
func parseMountLine(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 5 {
		return mountEntry{}, false
	}
	return mountEntry{dev: f[2], point: unescapeOctal(f[4])}, true
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline
// and backslash in mountinfo paths. Malformed escapes are kept as they are.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] >= '0' && s[i+1] <= '3' && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v := (s[i+1]-'0')*64 + (s[i+2]-'0')*8 + (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
