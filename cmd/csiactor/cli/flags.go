package cli

import (
	"fmt"
	"math"
	"sort"
	"strconv"
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

// sizeUnits are the suffixes parseSize knows, in bytes.
var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12, "p": 1e15, "pb": 1e15,
	"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
	"ti": 1 << 40, "tib": 1 << 40, "pi": 1 << 50, "pib": 1 << 50,
}

// parseSize parses a byte size: a number with an optional unit, decimal
// (k, MB, G, ...) or binary (Ki, MiB, GiB, ...), case-insensitive:
// "1GiB", "500M", "1.5TiB", "4096".
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q: want a size like 1GiB, 500MB or 4096", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want a size like 1GiB, 500MB or 4096", s)
	}
	b := f * mult
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return int64(b), nil
}

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
