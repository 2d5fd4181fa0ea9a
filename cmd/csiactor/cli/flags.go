package cli

import (
	"fmt"
	"github.com/csiactor/csiactor/runtime"
	"math"
	"sort"
	"strings"
)

// listFlag collects every use of a repeatable flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// kvFlag collects repeated KEY=VALUE flags into a map. For a secret flag,
// Set never fails (the flag package would print the value in its error);
// the mistake is kept and reported by check without the value.
type kvFlag struct {
	m      map[string]string
	secret bool
	err    error
}

func (f *kvFlag) String() string {
	if f == nil || len(f.m) == 0 {
		return ""
	}
	if f.secret {
		return fmt.Sprintf("[%d redacted]", len(f.m))
	}
	keys := make([]string, 0, len(f.m))
	for k := range f.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + f.m[k]
	}
	return strings.Join(keys, ",")
}

func (f *kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	var err error
	switch {
	case !ok || k == "":
		err = fmt.Errorf("want KEY=VALUE")
	case hasKey(f.m, k):
		err = fmt.Errorf("key %q given twice", k)
	}
	if err != nil {
		if f.secret {
			if f.err == nil {
				f.err = err
			}
			return nil
		}
		return err
	}
	if f.m == nil {
		f.m = map[string]string{}
	}
	f.m[k] = v
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// check returns the first mistake of a secret flag, naming the flag but
// not the value.
func (f *kvFlag) check(name string) error {
	if f.err == nil {
		return nil
	}
	if strings.Contains(f.err.Error(), "given twice") {
		return usagef("-%s: %s", name, f.err.Error())
	}
	return usagef("-%s: want KEY=VALUE (value not shown)", name)
}

// parseSize parses a byte size ([runtime.ParseSize]).
func parseSize(s string) (int64, error) { return runtime.ParseSize(s) }

// formatSize prints a byte count in binary units, "-" for 0.
func formatSize(n int64) string {
	if n <= 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f := float64(n)
	u := 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%d B", n)
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f %s", f, units[u])
	}
	return fmt.Sprintf("%.1f %s", f, units[u])
}
