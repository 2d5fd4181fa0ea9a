package container

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/csiactor/csiactor/internal/mountinfo"
)

// ensureShared makes dir a mount point with shared propagation (a bind
// mount of itself, made rshared, as the kubelet does with its pods
// directory), unless it is one already: a container's rshared bind of
// dir needs it, so that mounts made inside reach the host.
func ensureShared(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("volumes directory: %w", err)
	}
	point, shared, err := sharedMount(dir)
	if err != nil {
		return err
	}
	if shared {
		return nil
	}
	if !point {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s rshared: %w", dir, err)
	}
	return nil
}

// sharedMount reports whether dir is a mount point, and whether that
// mount has shared propagation, from /proc/self/mountinfo (the last entry
// for dir wins, as it is the one on top).
func sharedMount(dir string) (point, shared bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, false, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || mountinfo.Unescape(fields[4]) != dir {
			continue
		}
		point, shared = true, false
		for _, opt := range fields[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				shared = true
			}
		}
	}
	return point, shared, sc.Err()
}
