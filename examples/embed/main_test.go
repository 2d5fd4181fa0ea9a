package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// TestRun_WalkThrough runs the example and checks its story line by line,
// then that it left nothing behind: no goroutine, no directory, no mount.
func TestRun_WalkThrough(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	got := out.String()
	t.Logf("output:\n%s", got)

	dirRE := regexp.MustCompile(`(?m)^data dir (\S+)$`)
	m := dirRE.FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("no data dir line in the output")
	}
	dir := m[1]
	target := regexp.QuoteMeta(dir + "/data/volumes/example/per-alloc/web-1/data1/rw-file-system-single-node-writer")

	for _, want := range []string{
		`(?m)^plugin example healthy: provider example\.csi\.csiactor\.dev, controller required true$`,
		`(?m)^volume data1 created: 1073741824 bytes$`,
		`(?m)^claim web-1: published at ` + target + `$`,
		`(?m)^claim web-2: refused, single-node-writer allows one claim \(conflict\)$`,
		`(?m)^wrote hello\.txt$`,
		`(?m)^claim web-1: released \(taken\)$`,
		`(?m)^claim web-1: freed$`,
		`(?m)^events:$`,
		`(?m)^  allocation-registered +example-1 `,
		`(?m)^  health-changed +example-1 +- +healthy$`,
		`(?m)^  volume-created +- +data1 `,
		`(?m)^  claim-published +web-1 +data1 `,
		`(?m)^  claim-released +web-1 +data1 `,
		`(?m)^  claim-freed +web-1 +data1 `,
	} {
		if !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("output has no line matching %s", want)
		}
	}
	// The story is told in order.
	order := []string{"healthy:", "created:", "published at", "refused", "wrote", "released", "freed", "events:"}
	last := -1
	for _, s := range order {
		i := strings.Index(got, s)
		if i < last {
			t.Errorf("%q is printed before the step before it", s)
		}
		last = i
	}

	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data dir %s still exists after run (stat: %v)", dir, err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	if strings.Contains(string(mounts), dir) {
		t.Errorf("a mount under %s is left after run:\n%s", dir, mounts)
	}
}

// TestRun_Canceled checks that a canceled context stops the example with an
// error and still cleans up.
func TestRun_Canceled(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err == nil {
		t.Fatalf("run with a canceled context: got nil error\noutput:\n%s", out.String())
	}
	m := regexp.MustCompile(`(?m)^data dir (\S+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no data dir line in the output:\n%s", out.String())
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("data dir %s still exists (stat: %v)", m[1], err)
	}
}
