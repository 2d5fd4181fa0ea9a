package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Output files of a plugin, in its output directory: OutputFile is the
// one being written; OutputFile.1 is the one before it, and so on.
const (
	OutputFile = "output.log"
	// DefaultMaxOutputSize is the size at which the output file is rotated.
	DefaultMaxOutputSize = 10 << 20
	// DefaultMaxOutputFiles is how many rotated files are kept besides the
	// current one.
	DefaultMaxOutputFiles = 3
)

// Streams of a Line.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// maxLine is the longest output line kept as one record; a longer line is
// kept as several records of at most maxLine bytes each, so nothing is
// lost.
const maxLine = 64 << 10

// Line is one line a plugin wrote.
type Line struct {
	// Time is when the log shim read the line.
	Time time.Time
	// Stream is Stdout or Stderr.
	Stream string
	// Text is the line without its newline.
	Text string
}

// format is the line's record in the output file: "<RFC 3339 time>
// <stream> <text>\n".
func (l Line) format() []byte {
	b := make([]byte, 0, len(l.Text)+48)
	b = l.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, ' ')
	b = append(b, l.Stream...)
	b = append(b, ' ')
	b = append(b, l.Text...)
	return append(b, '\n')
}

// parseLine parses a record without its newline. A record that is not in
// the format (a file edited by hand) is kept whole as the text.
func parseLine(rec []byte) Line {
	ts, rest, ok := bytes.Cut(rec, []byte{' '})
	if !ok {
		return Line{Text: string(rec)}
	}
	stream, text, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return Line{Text: string(rec)}
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return Line{Text: string(rec)}
	}
	return Line{Time: t, Stream: string(stream), Text: string(text)}
}

// outputPath returns the path of the current output file (n == 0) or of
// the n-th rotated one.
func outputPath(dir string, n int) string {
	if n == 0 {
		return filepath.Join(dir, OutputFile)
	}
	return filepath.Join(dir, OutputFile+"."+strconv.Itoa(n))
}

// rotator appends records to the output file and rotates it when it
// would grow past max. Only the log shim writes; it is not safe for
// concurrent use.
type rotator struct {
	dir   string
	max   int64
	files int
	f     *os.File
	size  int64
}

func openRotator(dir string, max int64, files int) (*rotator, error) {
	if max <= 0 {
		max = DefaultMaxOutputSize
	}
	if files <= 0 {
		files = DefaultMaxOutputFiles
	}
	r := &rotator{dir: dir, max: max, files: files}
	return r, r.open()
}

func (r *rotator) open() error {
	f, err := os.OpenFile(outputPath(r.dir, 0), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return err
	}
	r.f, r.size = f, fi.Size()
	return nil
}

func (r *rotator) write(rec []byte) error {
	if r.size > 0 && r.size+int64(len(rec)) > r.max {
		if err := r.rotate(); err != nil {
			return err
		}
	}
	n, err := r.f.Write(rec)
	r.size += int64(n)
	return err
}

// rotate renames output.log.N-1 to .N, ..., output.log to .1, and opens a
// new output.log. The oldest file is overwritten.
func (r *rotator) rotate() error {
	_ = r.f.Close()
	for i := r.files - 1; i >= 1; i-- {
		if err := os.Rename(outputPath(r.dir, i), outputPath(r.dir, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Rename(outputPath(r.dir, 0), outputPath(r.dir, 1)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return r.open()
}

func (r *rotator) close() error { return r.f.Close() }

// ReadOutput returns the last tail lines of the output kept in dir (every
// kept line when tail is negative), oldest first. A directory without
// output yet has no lines.
func ReadOutput(dir string, tail int) ([]Line, error) {
	lines, _, _, err := readOutput(dir, tail)
	return lines, err
}

// readOutput is ReadOutput that also returns the current output file,
// open, and the offset its lines were read up to, so that a follower goes
// on from exactly there. f is nil when there is no output file yet.
func readOutput(dir string, tail int) (lines []Line, f *os.File, off int64, err error) {
	f, err = os.Open(outputPath(dir, 0))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, 0, fmt.Errorf("read plugin output: %w", err)
	}
	var recs [][]byte
	if f != nil {
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, nil, 0, fmt.Errorf("read plugin output: %w", err)
		}
		off = fi.Size()
		if tail == 0 {
			return nil, f, off, nil // nothing to read: the follower goes on from the end
		}
		b := make([]byte, off)
		n, err := f.ReadAt(b, 0)
		if err != nil && err != io.EOF {
			_ = f.Close()
			return nil, nil, 0, fmt.Errorf("read plugin output: %w", err)
		}
		// Only whole records: a record being written is read by the follower.
		b = b[:n]
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			b = b[:i+1]
		} else {
			b = nil
		}
		off = int64(len(b))
		recs = splitRecords(b)
	}
	// Older files, newest first, until tail records are found.
	for n := 1; tail < 0 || len(recs) < tail; n++ {
		b, err := os.ReadFile(outputPath(dir, n))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			if f != nil {
				_ = f.Close()
			}
			return nil, nil, 0, fmt.Errorf("read plugin output: %w", err)
		}
		recs = append(splitRecords(b), recs...)
	}
	if tail >= 0 && len(recs) > tail {
		recs = recs[len(recs)-tail:]
	}
	lines = make([]Line, 0, len(recs))
	for _, r := range recs {
		lines = append(lines, parseLine(r))
	}
	return lines, f, off, nil
}

func splitRecords(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, b)
			break
		}
		out = append(out, b[:i])
		b = b[i+1:]
	}
	return out
}

// How often a follower looks for new output: one that serves the API,
// and the agent's own, which logs every plugin's lines (a read and a stat
// per allocation each time).
const (
	followInterval  = 100 * time.Millisecond
	forwardInterval = 200 * time.Millisecond
)

// FollowOutput calls fn with the last tail lines of the output in dir
// (every kept line when tail is negative), then with every line written
// after them, across rotations, until ctx ends (it returns nil), fn
// returns an error (it returns that error), or dir, once it existed, is
// removed (the allocation was deregistered; it returns nil).
func FollowOutput(ctx context.Context, dir string, tail int, fn func(Line) error) error {
	lines, f, off, err := readOutput(dir, tail)
	if err != nil {
		return err
	}
	fo := &follower{dir: dir}
	if f != nil {
		fo.attach(f, off)
	}
	defer fo.close()
	for _, l := range lines {
		if err := fn(l); err != nil {
			return err
		}
	}
	t := time.NewTicker(followInterval)
	defer t.Stop()
	for {
		gone, err := fo.poll(fn)
		if err != nil || gone {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// follower reads the records appended to a plugin's output files, in
// order, across rotations.
type follower struct {
	dir  string
	seen bool // dir existed at some point

	f       *os.File
	ino     uint64
	off     int64 // where the last whole record read from f ends
	br      *bufio.Reader
	partial []byte
	next    []*os.File // kept files newer than f, oldest first, to read after it
}

// attach makes f, read up to off, the file followed.
func (fo *follower) attach(f *os.File, off int64) {
	if fo.f != nil {
		_ = fo.f.Close()
	}
	fo.f = f
	fo.ino = inode(f)
	fo.off, _ = f.Seek(off, io.SeekStart)
	fo.br = bufio.NewReaderSize(f, maxLine+64)
	fo.partial = nil
}

// openAtEnd starts following at the current end of the output file (or at
// the start of the one to come, when there is none yet).
func (fo *follower) openAtEnd() {
	f, err := os.Open(outputPath(fo.dir, 0))
	if err != nil {
		return
	}
	end, _ := f.Seek(0, io.SeekEnd)
	fo.attach(f, end)
}

// position is how far the follower has read.
func (fo *follower) position() position {
	if fo.f == nil {
		return position{} // no file yet: every record is still to be read
	}
	return position{Inode: fo.ino, Offset: fo.off}
}

// resume makes the follower go on from pos, in whichever kept output file
// has pos's inode now, then in every newer one. When none has it (pos is
// the zero position, or its file was rotated out), it starts at the
// oldest kept file: all of them are newer than pos.
func (fo *follower) resume(pos position) {
	fo.close()
	// Newest first: a rotation while they are opened makes a file seen
	// twice (kept once), never a newer one missed.
	var newest []*os.File
	seen := map[uint64]bool{}
	match, off := -1, int64(0)
	for n := 0; ; n++ {
		f, err := os.Open(outputPath(fo.dir, n))
		if errors.Is(err, os.ErrNotExist) && n > 0 {
			break
		}
		if err != nil {
			continue // output.log between a rotation's rename and create, or unreadable
		}
		var st *syscall.Stat_t
		fi, err := f.Stat()
		if err == nil {
			st, _ = fi.Sys().(*syscall.Stat_t)
		}
		if st == nil || seen[st.Ino] {
			_ = f.Close()
			continue
		}
		seen[st.Ino] = true
		if match < 0 && pos.Inode != 0 && st.Ino == pos.Inode && fi.Size() >= pos.Offset {
			match, off = len(newest), pos.Offset
		}
		newest = append(newest, f)
	}
	if match < 0 {
		match = len(newest) - 1 // the oldest (-1: no file yet)
	}
	for _, f := range newest[match+1:] {
		_ = f.Close() // older than pos
	}
	if match < 0 {
		return
	}
	fo.attach(newest[match], off)
	for i := match - 1; i >= 0; i-- {
		fo.next = append(fo.next, newest[i])
	}
}

func (fo *follower) close() {
	if fo.f != nil {
		_ = fo.f.Close()
		fo.f = nil
	}
	for _, f := range fo.next {
		_ = f.Close()
	}
	fo.next = nil
}

// poll calls fn for every whole record available. It reports gone when
// the output directory no longer exists.
func (fo *follower) poll(fn func(Line) error) (gone bool, err error) {
	for range 16 { // bounded: a rotation per round
		if fo.f != nil {
			if err := fo.drain(fn); err != nil {
				return false, err
			}
			if len(fo.next) > 0 { // catching up: the next newer file
				f := fo.next[0]
				fo.next = fo.next[1:]
				fo.attach(f, 0)
				continue
			}
		}
		fi, err := os.Stat(outputPath(fo.dir, 0))
		if err != nil {
			_, derr := os.Stat(fo.dir)
			switch {
			case derr == nil:
				fo.seen = true
			case errors.Is(derr, os.ErrNotExist) && fo.seen:
				return true, nil // removed
			}
			return false, nil // not created yet, or between a rotation's rename and create
		}
		fo.seen = true
		st, ok := fi.Sys().(*syscall.Stat_t)
		if fo.f != nil && ok && st.Ino == fo.ino {
			return false, nil
		}
		// Rotated, once or more (or created): what was written to the
		// followed file before the rename has been drained above; go on
		// with the files rotated since, then the new one.
		fo.resume(fo.position())
	}
	return false, nil
}

// drain reads the whole records available from the followed file.
func (fo *follower) drain(fn func(Line) error) error {
	for {
		chunk, err := fo.br.ReadSlice('\n')
		if len(chunk) > 0 {
			if chunk[len(chunk)-1] != '\n' {
				fo.partial = append(fo.partial, chunk...)
			} else {
				fo.off += int64(len(fo.partial) + len(chunk))
				rec := chunk[:len(chunk)-1]
				if len(fo.partial) > 0 {
					rec = append(fo.partial, rec...)
					fo.partial = nil
				}
				if err := fn(parseLine(rec)); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil // io.EOF: nothing more for now
		}
	}
}

func inode(f *os.File) uint64 {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
