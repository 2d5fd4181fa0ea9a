package cli

import (
	"strings"
	"testing"
)

func TestParseSize_Cases(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"4096", 4096, ""},
		{"1k", 1000, ""},
		{"1KiB", 1024, ""},
		{"500MB", 500e6, ""},
		{"1G", 1e9, ""},
		{"1GiB", 1 << 30, ""},
		{"1.5GiB", 3 << 29, ""},
		{"2 TiB", 2 << 40, ""},
		{"1gib", 1 << 30, ""},
		{"0", 0, ""},
		{"", 0, "want a size"},
		{"GiB", 0, "want a size"},
		{"10X", 0, "want a size"},
		{"-1G", 0, "want a size"},
		{"1.2.3G", 0, "want a size"},
		{"0.5", 0, "not a whole number"},
		{"9999999PiB", 0, "too large"},
	} {
		got, err := parseSize(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseSize(%q) = %d, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatSize_Cases(t *testing.T) {
	for in, want := range map[int64]string{0: "-", 512: "512 B", 1024: "1 KiB", 1536: "1.5 KiB", 1 << 30: "1 GiB", 5 << 40: "5 TiB"} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1GiB", "500M", "4096", "1.5TiB", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
	})
}

func TestKVFlag_Secret_NeverEchoes(t *testing.T) {
	f := &kvFlag{secret: true}
	if err := f.Set("hunter2"); err != nil {
		t.Fatalf("Set on a secret flag failed: %v", err)
	}
	err := f.check("secret")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("check = %v", err)
	}
	g := &kvFlag{secret: true}
	_ = g.Set("a=hunter2")
	if s := g.String(); strings.Contains(s, "hunter2") || s != "[1 redacted]" {
		t.Errorf("String() = %q", s)
	}
}

// Every flag whose values completion offers is a flag of some command, so
// the list cannot outlive a renamed flag.
func TestFlagValues_NameRealFlags(t *testing.T) {
	valued := map[string]bool{}
	for _, n := range completionTree(commands()) {
		for _, f := range n.valued {
			valued[f] = true
		}
	}
	for _, v := range flagValues() {
		if !valued["-"+v.path] {
			t.Errorf("completion offers values for -%s, which no command has (as a flag with a value)", v.path)
		}
		if len(v.subs) == 0 {
			t.Errorf("completion offers no values for -%s", v.path)
		}
	}
}
