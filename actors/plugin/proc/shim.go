package proc

import (
	"bufio"
	"flag"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// shimEnv marks the re-executed program as the log shim: see init.
const shimEnv = "CSIACTOR_LOG_SHIM"

// shimName is the log shim's argv[0], as ps shows it.
const shimName = "csiactor-log-shim"

// init turns the program into the log shim when the launcher started it
// as one. The shim is this same program re-executed (/proc/self/exe), so
// that it exists wherever the launcher does: in the csiactor binary, in a
// program that embeds the runtime, in a test binary. No program sets
// CSIACTOR_LOG_SHIM itself.
func init() {
	if os.Getenv(shimEnv) == "1" {
		os.Exit(runShim(os.Args[1:]))
	}
}

// shimCommand returns the arguments of a log shim that writes to dir.
func shimCommand(dir string, maxSize int64, maxFiles int) []string {
	return []string{shimName, "-dir", dir,
		"-max-size", strconv.FormatInt(maxSize, 10), "-max-files", strconv.Itoa(maxFiles)}
}

// runShim is the log shim: it reads the plugin's stdout (fd 3) and stderr
// (fd 4) pipes line by line and appends each line, stamped with the time
// and the stream, to the rotated output files in -dir. It exits when both
// pipes are closed on the plugin's side, that is when the plugin and every
// process that inherited its output are gone. It ignores SIGTERM, SIGINT
// and SIGHUP, so that it outlives whatever stops its plugin and writes the
// plugin's last lines: a write to a pipe without a reader would kill the
// plugin with SIGPIPE, so the reader must outlive the agent and the
// plugin both.
func runShim(args []string) int {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	fs := flag.NewFlagSet(shimName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("dir", "", "output directory")
	maxSize := fs.Int64("max-size", DefaultMaxOutputSize, "rotate at this size")
	maxFiles := fs.Int("max-files", DefaultMaxOutputFiles, "rotated files kept")
	if err := fs.Parse(args); err != nil || *dir == "" {
		return 2
	}
	out, err := openRotator(*dir, *maxSize, *maxFiles)
	var mu sync.Mutex // guards out
	write := func(stream string, text []byte) {
		mu.Lock()
		defer mu.Unlock()
		if out == nil {
			return // no file: the pipes are still drained, so the plugin runs on
		}
		if err := out.write(Line{Time: time.Now(), Stream: stream, Text: string(text)}.format()); err != nil {
			// A full disk, say: try again at the next line.
			_ = out.close()
			out, _ = openRotator(*dir, *maxSize, *maxFiles)
		}
	}
	if err != nil {
		out = nil
	}
	var wg sync.WaitGroup
	for fd, stream := range map[uintptr]string{3: Stdout, 4: Stderr} {
		f := os.NewFile(fd, stream)
		if f == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer f.Close()
			copyLines(f, func(text []byte) { write(stream, text) })
		}()
	}
	wg.Wait()
	if out != nil {
		_ = out.close()
	}
	return 0
}

// copyLines calls fn with each line read from r, without its newline; a
// line longer than maxLine comes in pieces of maxLine bytes. A last line
// without a newline is passed too.
func copyLines(r io.Reader, fn func([]byte)) {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		chunk, _, err := br.ReadLine()
		if len(chunk) > 0 || err == nil {
			fn(chunk)
		}
		if err != nil {
			return
		}
	}
}
