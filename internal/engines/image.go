package engines

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// PluginTar returns a rootfs tar for an image that runs the static binary
// bin as its entrypoint (/plugin), with the busybox applets of Image
// beside it: Image's rootfs plus /plugin.
func PluginTar(bin string) ([]byte, error) {
	base, err := RootfsTar()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("plugin for the image: %w", err)
	}
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	r := tar.NewReader(bytes.NewReader(base))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(w, r); err != nil {
			return nil, err
		}
	}
	if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "plugin", Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return nil, err
	}
	if _, err := w.Write(data); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// importPlugin imports PluginTar(bin) as ref with cmd (`docker import` or
// `podman import`, reading the tar from stdin) and entrypoint /plugin.
func importPlugin(tb testing.TB, cmd *exec.Cmd, bin string) {
	tb.Helper()
	data, err := PluginTar(bin)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdin = bytes.NewReader(data)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
}

// ImportPlugin imports an image ref into this dockerd that runs the
// static binary bin as its entrypoint (see PluginTar).
func (d *Docker) ImportPlugin(tb testing.TB, ref, bin string) {
	importPlugin(tb, d.Command("import", "--change", `ENTRYPOINT ["/plugin"]`, "-", ref), bin)
}

// ImportPlugin imports an image ref into this Podman that runs the static
// binary bin as its entrypoint (see PluginTar).
func (p *Podman) ImportPlugin(tb testing.TB, ref, bin string) {
	importPlugin(tb, p.Command("import", "--change", `ENTRYPOINT ["/plugin"]`, "-", ref), bin)
}
