package csiplugin

import (
	"strings"
	"syscall"
	"testing"
)

func TestCountMountPoints(t *testing.T) {
	table := strings.Join([]string{
		`22 1 0:21 / / rw,relatime - ext4 /dev/vda rw`,
		`40 22 254:0 /vols/a /mnt/stage rw,relatime - ext4 /dev/vda rw`,
		`41 40 254:0 /vols/a /mnt/stage rw,relatime - ext4 /dev/vda rw`,
		`42 22 254:0 /vols/b /mnt/with\040space rw,relatime - ext4 /dev/vda rw`,
		`43 22 254:0 /vols/c /mnt/back\134slash rw - ext4 /dev/vda rw`,
		`garbage`,
	}, "\n")
	tests := []struct {
		path string
		want int
	}{
		{"/", 1},
		{"/mnt/stage", 2},
		{"/mnt/with space", 1},
		{`/mnt/back\slash`, 1},
		{"/mnt", 0},
		{"/mnt/stage/sub", 0},
	}
	for _, tt := range tests {
		got, err := countMountPoints(strings.NewReader(table), tt.path)
		if err != nil || got != tt.want {
			t.Errorf("countMountPoints(%q) = %d, %v; want %d", tt.path, got, err, tt.want)
		}
	}
}

func TestParseMountFlags(t *testing.T) {
	tests := []struct {
		flags   []string
		want    uintptr
		wantErr string
	}{
		{nil, 0, ""},
		{[]string{"ro"}, syscall.MS_RDONLY, ""},
		{[]string{"ro,nosuid", "nodev"}, syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV, ""},
		{[]string{"rw", " noexec "}, syscall.MS_NOEXEC, ""},
		{[]string{"ro", "password=hunter2"}, 0, "mount_flags[1]"},
	}
	for _, tt := range tests {
		got, err := parseMountFlags(tt.flags)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseMountFlags(%d flags) error %v, want one naming %s", len(tt.flags), err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %q quotes a mount flag", err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseMountFlags(%q) = %#x, %v; want %#x", tt.flags, got, err, tt.want)
		}
	}
}

func FuzzUnescapeOctal(f *testing.F) {
	for _, s := range []string{`/a\040b`, `\134`, `\`, `\0`, `\777`, `/plain`, `\0400`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := unescapeOctal(s)
		if len(got) > len(s) {
			t.Fatalf("unescapeOctal(%q) = %q grew", s, got)
		}
		if !strings.Contains(s, `\`) && got != s {
			t.Fatalf("unescapeOctal(%q) = %q changed a string without escapes", s, got)
		}
	})
}
