// Package mountinfo reads the mount points of this process's mount
// namespace from /proc/self/mountinfo.
package mountinfo

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// DefaultPath is the mount table of this process's mount namespace.
const DefaultPath = "/proc/self/mountinfo"

// Under returns the mount points at or below dir, deepest first (the order
// to unmount them in). dir must be clean and absolute; it is compared as it
// is, so resolve symlinks first where that matters. Where there is no
// /proc/self/mountinfo (not Linux), it returns none.
func Under(dir string) ([]string, error) {
	f, err := os.Open(DefaultPath)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	var out []string // a mount point with mounts stacked on it is listed once per mount
	if err := scan(f, dir, func(mp string) { out = append(out, mp) }); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// scan calls fn with every mount point of the table r at or below dir
// (every one when dir is "" or "/"), in the table's order.
func scan(r io.Reader, dir string, fn func(mountPoint string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// Field 5 is the mount point.
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := Unescape(fields[4])
		if dir == "" || dir == "/" || mp == dir || strings.HasPrefix(mp, dir+"/") {
			fn(mp)
		}
	}
	return sc.Err()
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

// Table is a snapshot of the mount points at or below one directory. It is
// never changed after Read returns it, so it can be shared.
type Table struct {
	points map[string]struct{}
}

// Read reads the mount table file (DefaultPath when file is empty) and
// returns its mount points at or below dir (every one when dir is "/" or
// empty). dir is resolved through symlinks first, as the kernel shows real
// paths. A missing table (not Linux, no /proc) is an error wrapping
// fs.ErrNotExist: an empty table would say that nothing is mounted.
func Read(file, dir string) (*Table, error) {
	if file == "" {
		file = DefaultPath
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, realPath(dir))
}

func parse(r io.Reader, dir string) (*Table, error) {
	t := &Table{points: map[string]struct{}{}}
	if err := scan(r, dir, func(mp string) { t.points[mp] = struct{}{} }); err != nil {
		return nil, err
	}
	return t, nil
}

// Has reports whether path (made clean, and resolved through symlinks in
// its parent directories) is a mount point in the table.
func (t *Table) Has(path string) bool {
	if t == nil || path == "" {
		return false
	}
	p := filepath.Clean(path)
	if _, ok := t.points[p]; ok {
		return true
	}
	// The kernel shows real paths: resolve the parents (not path itself,
	// whose own symlink is not a mount point).
	if parent, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		_, ok := t.points[filepath.Join(parent, filepath.Base(p))]
		return ok
	}
	return false
}

// Len returns the number of mount points in the table.
func (t *Table) Len() int { return len(t.points) }

func realPath(dir string) string {
	if dir == "" {
		return ""
	}
	dir = filepath.Clean(dir)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return r
	}
	return dir
}

// FSType returns the file system type of the top mount at path (as
// "fuse.name" for a FUSE file system), or "" when path is not a mount
// point. path is compared as it is, like Under's dir.
func FSType(path string) (string, error) {
	b, err := os.ReadFile(DefaultPath)
	if err != nil {
		return "", err
	}
	typ := ""
	for _, line := range strings.Split(string(b), "\n") {
		// The fields after " - " are the type, the source and the options.
		pre, post, ok := strings.Cut(line, " - ")
		fields, rest := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) >= 5 && len(rest) >= 1 && Unescape(fields[4]) == path {
			typ = rest[0]
		}
	}
	return typ, nil
}
