package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRotator_RotatesAndReadOutputTails(t *testing.T) {
	dir := t.TempDir()
	r, err := openRotator(dir, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for i := range 20 {
		stream := Stdout
		if i%2 == 1 {
			stream = Stderr
		}
		if err := r.write(Line{Time: t0.Add(time.Duration(i) * time.Second), Stream: stream, Text: fmt.Sprintf("line %02d", i)}.format()); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 2} {
		fi, err := os.Stat(outputPath(dir, n))
		if err != nil || fi.Size() > 100 {
			t.Errorf("file %d: %v, size %d; want at most 100 bytes", n, err, fi.Size())
		}
	}
	if _, err := os.Stat(outputPath(dir, 3)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a third rotated file exists (%v); want two kept", err)
	}
	all, err := ReadOutput(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 || all[len(all)-1].Text != "line 19" || all[len(all)-1].Stream != Stderr {
		t.Fatalf("lines %+v, want the last one 'line 19' on stderr", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Time.Before(all[i-1].Time) {
			t.Errorf("lines out of order: %+v", all)
		}
	}
	last3, err := ReadOutput(dir, 3)
	if err != nil || len(last3) != 3 || last3[0].Text != "line 17" || !last3[2].Time.Equal(t0.Add(19*time.Second)) {
		t.Errorf("tail 3 = %+v, %v", last3, err)
	}
	if none, err := ReadOutput(t.TempDir(), 10); err != nil || len(none) != 0 {
		t.Errorf("no output yet: %+v, %v", none, err)
	}
}

func TestParseLine(t *testing.T) {
	l := Line{Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Stream: Stderr, Text: "a b  c"}
	rec := l.format()
	if got := parseLine(rec[:len(rec)-1]); got != l {
		t.Errorf("round trip: %+v, want %+v", got, l)
	}
	if got := parseLine([]byte("not a record")); got.Text != "not a record" || got.Stream != "" {
		t.Errorf("foreign line: %+v", got)
	}
}

func TestCopyLines_LongLineInPieces(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	var got []string
	copyLines(strings.NewReader("a\n"+long+"\n\nlast"), func(b []byte) { got = append(got, string(b)) })
	want := []string{"a", long[:maxLine], long[maxLine:], "", "last"}
	if len(got) != len(want) {
		t.Fatalf("%d pieces, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("piece %d: %d bytes, want %d", i, len(got[i]), len(want[i]))
		}
	}
}

// FollowOutput gives the tail, then new lines across rotations, however
// many came between two looks, and ends when the directory is removed.
func TestFollowOutput_AcrossRotation(t *testing.T) {
	dir := t.TempDir()
	r, err := openRotator(dir, 200, 2)
	if err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		if err := r.write(Line{Time: time.Now(), Stream: Stdout, Text: s}.format()); err != nil {
			t.Error(err)
		}
	}
	write("old 1")
	write("old 2")
	got := make(chan string, 100)
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		errc <- FollowOutput(ctx, dir, 1, func(l Line) error { got <- l.Text; return nil })
	}()
	next := func() string {
		select {
		case s := <-got:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no line")
			return ""
		}
	}
	if s := next(); s != "old 2" {
		t.Fatalf("first line %q, want the tail 'old 2'", s)
	}
	for i := range 12 { // several rotations of 200 bytes, a line at a time
		write(fmt.Sprintf("new %02d", i))
		if s, want := next(), fmt.Sprintf("new %02d", i); s != want {
			t.Fatalf("line %q, want %q", s, want)
		}
	}
	// Eight lines (of 44 to 46 bytes, four a file) at once: two
	// rotations, likely before the follower looks again; it reads on
	// through the rotated files.
	for i := range 8 {
		write(fmt.Sprintf("burst %d", i))
	}
	for i := range 8 {
		if s, want := next(), fmt.Sprintf("burst %d", i); s != want {
			t.Fatalf("line %q, want %q", s, want)
		}
	}
	_ = r.close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("FollowOutput = %v after the dir was removed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("FollowOutput did not end when its dir was removed")
	}
}
