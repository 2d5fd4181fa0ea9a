// Package mountinfo reads the mount points of this process's mount
// namespace from /proc/self/mountinfo.
package mountinfo

import (
	"bufio"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Under returns the mount points at or below dir, deepest first (the order
// to unmount them in). dir must be clean and absolute; it is compared as it
// is, so resolve symlinks first where that matters. Where there is no
// /proc/self/mountinfo (not Linux), it returns none.
func Under(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// Field 5 is the mount point.
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// IsMountPoint reports whether path is a mount point (false when
// mountinfo cannot be read).
func IsMountPoint(path string) bool {
	mounts, _ := Under(path)
	for _, m := range mounts {
		if m == path {
			return true
		}
	}
	return false
}

// Unescape undoes the \NNN octal escapes of /proc/self/mountinfo (\040 for
// a space, \011 for a tab, \012 for a newline, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
