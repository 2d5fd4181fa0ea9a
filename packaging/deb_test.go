package packaging

import (
	"archive/tar"
	"bytes"
	"crypto/md5"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	csiruntime "github.com/csiactor/csiactor/runtime"

	"github.com/csiactor/csiactor/internal/testbin"
)

const (
	// envDpkg, when set (.ci/run sets it), makes a missing make,
	// dpkg-deb or unshare a failure instead of a skip.
	envDpkg = "CSIACTOR_TEST_DPKG"
	// envDpkgInstall, when set (.ci/run sets it; root only), lets
	// TestDeb_InstallRemovePurge install the package into this system and
	// purge it again.
	envDpkgInstall = "CSIACTOR_TEST_DPKG_INSTALL"

	// The package is built from a fixed VERSION and REVISION, so the
	// versions it shows are known whatever the checkout's git state.
	testVersion    = "v1.2.3-4-gabcdef0-dirty"
	testRevision   = "abcdef012345"
	wantDebVersion = "1.2.3+4.gabcdef0.dirty"

	conffile = "/etc/csiactor/csiactor.yaml"
)

// wantFiles are the package's files (directories aside) and their modes
// as `dpkg-deb -c` shows them.
var wantFiles = map[string]string{
	"/usr/bin/csiactor":                                      "-rwxr-xr-x",
	"/usr/lib/systemd/system/csiactor.service":               "-rw-r--r--",
	"/etc/csiactor/csiactor.yaml":                            "-rw-r--r--",
	"/usr/share/bash-completion/completions/csiactor":        "-rw-r--r--",
	"/usr/share/zsh/vendor-completions/_csiactor":            "-rw-r--r--",
	"/usr/share/fish/vendor_completions.d/csiactor.fish":     "-rw-r--r--",
	"/usr/share/csiactor/monitoring/csiactor.rules.yml":      "-rw-r--r--",
	"/usr/share/csiactor/monitoring/csiactor-dashboard.json": "-rw-r--r--",
	"/usr/share/doc/csiactor/copyright":                      "-rw-r--r--",
}

// fromRepo maps the packaged files that are copies of repository files to
// those files.
var fromRepo = map[string]string{
	"/usr/lib/systemd/system/csiactor.service":               "../examples/config/csiactor.service",
	"/etc/csiactor/csiactor.yaml":                            "../examples/config/csiactor.yaml",
	"/usr/share/csiactor/monitoring/csiactor.rules.yml":      "../examples/monitoring/csiactor.rules.yml",
	"/usr/share/csiactor/monitoring/csiactor-dashboard.json": "../examples/monitoring/csiactor-dashboard.json",
	"/usr/share/doc/csiactor/copyright":                      "../LICENSE",
}

// completions maps each shell to its packaged completion script.
var completions = map[string]string{
	"bash": "/usr/share/bash-completion/completions/csiactor",
	"zsh":  "/usr/share/zsh/vendor-completions/_csiactor",
	"fish": "/usr/share/fish/vendor_completions.d/csiactor.fish",
}

var scripts = []string{"postinst", "prerm", "postrm"}

// need returns the path of a command the tests run: failing where
// $CSIACTOR_TEST_DPKG is set, skipping elsewhere.
func need(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(envDpkg) != "" {
			t.Fatalf("%s is not installed (%s is set)", name, envDpkg)
		}
		t.Skipf("%s is not installed; .ci/run has it", name)
	}
	return p
}

// run runs a command and returns its stdout, failing t with its output
// when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// deb is the package `make deb` built for this test process.
var deb struct {
	once sync.Once
	path string
	dir  string // removed by TestMain
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if deb.dir != "" {
		os.RemoveAll(deb.dir)
	}
	os.Exit(code)
}

// buildDeb runs `make deb` once per test process, into a directory of its
// own, and returns the package.
func buildDeb(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the Debian package; skipped with -short")
	}
	need(t, "make")
	need(t, "dpkg-deb")
	goBin, err := testbin.GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	deb.once.Do(func() {
		if deb.dir, deb.err = os.MkdirTemp("", "csiactor-deb-"); deb.err != nil {
			return
		}
		args := []string{"-C", "..", "deb", "GO=" + goBin, "VERSION=" + testVersion, "REVISION=" + testRevision,
			"DEB_OUT=" + deb.dir, "DEB_STAGE=" + filepath.Join(deb.dir, "stage")}
		out, err := exec.Command("make", args...).CombinedOutput()
		if err != nil {
			deb.err = fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		debs, _ := filepath.Glob(filepath.Join(deb.dir, "*.deb"))
		if len(debs) != 1 {
			deb.err = fmt.Errorf("make deb left %d packages in %s, want 1: %q\n%s", len(debs), deb.dir, debs, out)
			return
		}
		deb.path = debs[0]
	})
	if deb.err != nil {
		t.Fatal(deb.err)
	}
	return deb.path
}

// debArch is GOARCH in Debian's names (for the architectures whose names
// differ).
func debArch(goarch string) string {
	if a, ok := map[string]string{"386": "i386", "arm": "armhf", "ppc64le": "ppc64el", "mips64le": "mips64el", "mipsle": "mipsel"}[goarch]; ok {
		return a
	}
	return goarch
}

// TestDebVersion: debversion.sh turns what git describe gives into a
// Debian version that sorts after the tag it counts from, and refuses
// what cannot be one.
func TestDebVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                  "1.2.3",
		"1.2.3":                   "1.2.3",
		"v1.2.3-4-gabcdef0":       "1.2.3+4.gabcdef0",
		"v1.2.3-4-gabcdef0-dirty": "1.2.3+4.gabcdef0.dirty",
		"v10.0.1-12-g0123456":     "10.0.1+12.g0123456",
		"abcdef0":                 "0.0.0+git.abcdef0",
		"630c86b":                 "0.0.0+git.630c86b", // a commit ID starting with digits is no version
		"630c86b-dirty":           "0.0.0+git.630c86b.dirty",
	} {
		out, err := exec.Command("sh", "debversion.sh", in).CombinedOutput()
		if err != nil {
			t.Errorf("debversion.sh %s: %v\n%s", in, err, out)
			continue
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("debversion.sh %s = %q, want %q", in, got, want)
		}
	}
	for in, wantErr := range map[string]string{
		"":         "usage",
		"v1.2/3":   "v1.2/3 gives 1.2/3",
		"v1.2.3_x": "v1.2.3_x gives 1.2.3_x",
	} {
		out, err := exec.Command("sh", "debversion.sh", in).CombinedOutput()
		if err == nil || !strings.Contains(string(out), wantErr) {
			t.Errorf("debversion.sh %q: err %v, output %q; want a failure saying %q", in, err, out, wantErr)
		}
	}
}

// TestDeb_Contents checks the package's file list and modes: exactly
// wantFiles, root-owned, and directories 0755.
func TestDeb_Contents(t *testing.T) {
	p := buildDeb(t)
	listing := run(t, "dpkg-deb", "-c", p)
	t.Logf("dpkg-deb -c %s:\n%s", filepath.Base(p), listing)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(listing), "\n") {
		// drwxr-xr-x root/root 0 2026-11-26 12:06 ./etc/
		f := strings.Fields(line)
		if len(f) != 6 {
			t.Errorf("unexpected line (a link?) in dpkg-deb -c: %q", line)
			continue
		}
		mode, owner, name := f[0], f[1], strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")
		if owner != "root/root" {
			t.Errorf("%s is owned by %s, want root/root", name, owner)
		}
		if mode[0] == 'd' {
			if mode != "drwxr-xr-x" {
				t.Errorf("directory %s has mode %s, want drwxr-xr-x", name, mode)
			}
			continue
		}
		got[name] = mode
	}
	for name, want := range wantFiles {
		if m, ok := got[name]; !ok {
			t.Errorf("the package has no %s", name)
		} else if m != want {
			t.Errorf("%s has mode %s, want %s", name, m, want)
		}
	}
	for name := range got {
		if _, ok := wantFiles[name]; !ok {
			t.Errorf("the package has %s, which it should not", name)
		}
	}
}

// TestDeb_Control checks the package's name, version, architecture and
// file name, and that it depends on nothing (the binary is static).
func TestDeb_Control(t *testing.T) {
	p := buildDeb(t)
	field := func(name string) string { return strings.TrimSpace(run(t, "dpkg-deb", "-f", p, name)) }
	arch := debArch(runtime.GOARCH)
	for name, want := range map[string]string{
		"Package": "csiactor", "Version": wantDebVersion, "Architecture": arch,
		"Depends": "", "Pre-Depends": "", "Section": "admin", "Priority": "optional",
		"Homepage": "https://github.com/csiactor/csiactor",
	} {
		if got := field(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := field("Description"); !strings.HasPrefix(got, "CSI plugin supervisor") {
		t.Errorf("Description %q, want the one-line summary first", got)
	}
	if got, want := filepath.Base(p), "csiactor_"+wantDebVersion+"_"+arch+".deb"; got != want {
		t.Errorf("make deb made %s, want %s", got, want)
	}
	info := run(t, "dpkg-deb", "-I", p)
	for _, name := range append([]string{"conffiles", "md5sums", "control"}, scripts...) {
		if !strings.Contains(info, " "+name+" ") {
			t.Errorf("dpkg-deb -I lists no %s:\n%s", name, info)
		}
	}
}

// ctrlFile is a file of the control archive.
type ctrlFile struct {
	mode int64
	data string
}

// controlFiles reads the control archive (dpkg-deb --ctrl-tarfile).
func controlFiles(t *testing.T, p string) map[string]ctrlFile {
	t.Helper()
	tr := tar.NewReader(strings.NewReader(run(t, "dpkg-deb", "--ctrl-tarfile", p)))
	files := map[string]ctrlFile{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("read the control archive: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, "./")] = ctrlFile{mode: h.Mode & 0o7777, data: string(data)}
	}
}

// TestDeb_ConffilesAndScripts checks the control archive: the sample
// config is the one conffile, the maintainer scripts are the repository's
// and executable, and md5sums covers every other file.
func TestDeb_ConffilesAndScripts(t *testing.T) {
	p := buildDeb(t)
	ctrl := controlFiles(t, p)
	if h, ok := ctrl["conffiles"]; !ok {
		t.Error("the control archive has no conffiles")
	} else if got := h.data; got != conffile+"\n" {
		t.Errorf("conffiles = %q, want %q", got, conffile+"\n")
	}
	for _, name := range scripts {
		h, ok := ctrl[name]
		if !ok {
			t.Errorf("the control archive has no %s", name)
			continue
		}
		if h.mode != 0o755 {
			t.Errorf("%s has mode %o, want 0755", name, h.mode)
		}
		want, err := os.ReadFile(filepath.Join("deb", name))
		if err != nil {
			t.Fatal(err)
		}
		if h.data != string(want) {
			t.Errorf("the packaged %s differs from packaging/deb/%s", name, name)
		}
	}

	dir := t.TempDir()
	run(t, "dpkg-deb", "-x", p, dir)
	h, ok := ctrl["md5sums"]
	if !ok {
		t.Fatal("the control archive has no md5sums")
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(h.data), "\n") {
		sum, name, _ := strings.Cut(line, "  ")
		sums["/"+name] = sum
	}
	for name := range wantFiles {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		sum := md5.Sum(data)
		if got, want := sums[name], hex.EncodeToString(sum[:]); got != want {
			t.Errorf("md5sums has %q for %s, want %s", got, name, want)
		}
	}
}

// TestDeb_Extracted unpacks the package and checks what it installs: the
// binary runs and reports the version it was built as, is static, and
// generated the packaged completions; the unit and the sample config
// point at packaged files; the copied files are the repository's; the
// sample config loads and validates as the agent would load it.
func TestDeb_Extracted(t *testing.T) {
	p := buildDeb(t)
	dir := t.TempDir()
	run(t, "dpkg-deb", "-x", p, dir)
	bin := filepath.Join(dir, "usr/bin/csiactor")

	out := run(t, bin, "version")
	if want := "csiactor " + testVersion + " (" + testRevision + ") go"; !strings.HasPrefix(out, want) {
		t.Errorf("csiactor version = %q, want it to start with %q", out, want)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("the packaged binary is dynamically linked (it has an ELF interpreter); the package declares no dependencies")
		}
	}
	f.Close()

	for shell, path := range completions {
		data, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Fatal(err)
		}
		if want := run(t, bin, "completion", shell); string(data) != want || len(data) == 0 {
			t.Errorf("%s (%d bytes) is not what `csiactor completion %s` prints (%d bytes)", path, len(data), shell, len(want))
		}
	}
	for path, src := range fromRepo {
		got, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the packaged %s differs from %s", path, src)
		}
	}

	// The unit runs the packaged binary on the packaged config.
	unit, err := os.ReadFile(filepath.Join(dir, "usr/lib/systemd/system/csiactor.service"))
	if err != nil {
		t.Fatal(err)
	}
	var execStart []string
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = strings.Fields(v)
		}
	}
	if len(execStart) < 4 || execStart[0] != "/usr/bin/csiactor" || execStart[1] != "agent" ||
		!slices.Equal(execStart[2:4], []string{"-config", conffile}) {
		t.Errorf("the unit's ExecStart is %q, want /usr/bin/csiactor agent -config %s", execStart, conffile)
	}

	// The sample config loads and validates as `csiactor agent -config`
	// does (the agent has no check-only mode), and its exec-managed
	// plugins run the packaged binary.
	cfg, err := csiruntime.LoadConfigFile(filepath.Join(dir, conffile))
	if err != nil {
		t.Fatalf("the packaged config: %v", err)
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Errorf("the packaged config does not validate: %v", err)
	}
	execs := 0
	for _, a := range cfg.Allocations {
		if len(a.Command) == 0 {
			continue
		}
		execs++
		if mode, ok := wantFiles[a.Command[0]]; !ok || !strings.Contains(mode, "x") {
			t.Errorf("allocation %s runs %s, which is no executable of the package", a.ID, a.Command[0])
		}
	}
	if execs == 0 {
		t.Error("the packaged config has no exec-managed allocation to check the command of")
	}
}

// wrapScript runs a maintainer script ($2, arguments after it) in a mount
// namespace of its own, on tmpfs mounts over /run/systemd (with
// /run/systemd/system, which says systemd runs, when $1 is "yes"),
// /etc/systemd/system (holding an enablement link to the unit) and
// /var/lib (holding a data dir), so nothing it does reaches this system;
// then it reports whether the link and the data dir are still there.
const wrapScript = `set -e
systemd=$1 script=$2
shift 2
if [ -d /run/systemd ]; then mount -t tmpfs csiactor-test /run/systemd; else mount -t tmpfs csiactor-test /run; fi
if [ "$systemd" = yes ]; then mkdir -p /run/systemd/system; fi
for d in /etc/systemd/system /etc/systemd; do
	if [ -d "$d" ]; then mount -t tmpfs csiactor-test "$d"; break; fi
done
mountpoint -q /etc/systemd/system || mountpoint -q /etc/systemd || { echo "no /etc/systemd to mount a tmpfs over" >&2; exit 1; }
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -s /usr/lib/systemd/system/csiactor.service /etc/systemd/system/multi-user.target.wants/csiactor.service
mount -t tmpfs csiactor-test /var/lib
mkdir /var/lib/csiactor
sh "$script" "$@"
if [ -L /etc/systemd/system/multi-user.target.wants/csiactor.service ]; then echo "link: kept"; else echo "link: removed"; fi
if [ -d /var/lib/csiactor ]; then echo "data: kept"; else echo "data: removed"; fi
`

// TestDeb_MaintainerScripts runs the packaged maintainer scripts with a
// systemctl that only records its arguments: where systemd runs, they
// reload it, stop the agent on removal, and never start, enable or
// restart it; where it does not, they call no systemctl. Purge drops the
// unit's enablement and keeps the data dir.
func TestDeb_MaintainerScripts(t *testing.T) {
	p := buildDeb(t)
	if os.Geteuid() != 0 {
		t.Skip("runs the maintainer scripts in a mount namespace of their own: needs root")
	}
	unshare := need(t, "unshare")
	need(t, "mount")

	dir := t.TempDir()
	for name, h := range controlFiles(t, p) {
		if slices.Contains(scripts, name) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(h.data), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	fakeBin := filepath.Join(dir, "bin")
	if err := os.Mkdir(fakeBin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fakeBin, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>\"$SYSTEMCTL_LOG\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		args         []string
		withSystemd  []string // systemctl calls where systemd runs
		linkRemoved  bool
		saysDataKept bool
	}{
		{args: []string{"postinst", "configure", ""}, withSystemd: []string{"daemon-reload"}},
		{args: []string{"postinst", "configure", "1.0.0"}, withSystemd: []string{"daemon-reload"}}, // an upgrade
		{args: []string{"prerm", "upgrade", "2.0.0"}},
		{args: []string{"prerm", "remove"}, withSystemd: []string{"stop csiactor.service"}},
		{args: []string{"postrm", "upgrade", "2.0.0"}},
		{args: []string{"postrm", "remove"}, withSystemd: []string{"daemon-reload"}},
		{args: []string{"postrm", "purge"}, withSystemd: []string{"daemon-reload"}, linkRemoved: true, saysDataKept: true},
	}
	for _, systemd := range []bool{true, false} {
		for _, c := range cases {
			name := fmt.Sprintf("%s/systemd=%t", strings.Join(c.args, " "), systemd)
			log := filepath.Join(dir, "systemctl.log")
			os.Remove(log)
			yes := map[bool]string{true: "yes", false: "no"}[systemd]
			args := append([]string{"-m", "--propagation", "private", "sh", "-c", wrapScript, "sh", yes, filepath.Join(dir, c.args[0])}, c.args[1:]...)
			cmd := exec.Command(unshare, args...)
			cmd.Env = append(os.Environ(), "PATH="+fakeBin+":"+os.Getenv("PATH"), "SYSTEMCTL_LOG="+log)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("%s: %v\n%s%s", name, err, stdout.Bytes(), stderr.Bytes())
				continue
			}
			var calls []string
			if data, err := os.ReadFile(log); err == nil {
				calls = strings.Split(strings.TrimSpace(string(data)), "\n")
			}
			var want []string
			if systemd {
				want = c.withSystemd
			}
			if !slices.Equal(calls, want) {
				t.Errorf("%s: systemctl calls %q, want %q", name, calls, want)
			}
			wantOut := map[bool]string{true: "link: removed\n", false: "link: kept\n"}[c.linkRemoved] + "data: kept\n"
			if stdout.String() != wantOut {
				t.Errorf("%s: after it:\n%s\nwant:\n%s", name, stdout.String(), wantOut)
			}
			if says := strings.Contains(stderr.String(), "/var/lib/csiactor"); says != c.saysDataKept {
				t.Errorf("%s: stderr %q; want a note that /var/lib/csiactor is kept: %t", name, stderr.String(), c.saysDataKept)
			}
		}
	}
}

// status is the package's dpkg status ("install ok installed",
// "deinstall ok config-files"), or "" when dpkg knows nothing of it or
// only that it is not installed.
func status(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "csiactor").Output()
	if err != nil || strings.HasSuffix(string(out), "not-installed") {
		return ""
	}
	return string(out)
}

// apt runs apt-get non-interactively, waiting for the dpkg lock as long as
// another apt or dpkg holds it.
func apt(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("apt-get", append([]string{"-y", "-q", "-o", "DPkg::Lock::Timeout=600"}, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestDeb_InstallRemovePurge installs the package as the README says (apt
// install ./csiactor_*.deb), checks dpkg's view of it, that its conffile
// is in place and that nothing was started, then removes it (the edited
// conffile stays) and purges it (nothing of it stays, and a data dir is
// left as it was). It runs only where $CSIACTOR_TEST_DPKG_INSTALL is set
// (.ci/run sets it) and as root, refuses to run where csiactor is
// installed or any of its files exists, and always purges what it
// installed.
func TestDeb_InstallRemovePurge(t *testing.T) {
	if os.Getenv(envDpkgInstall) == "" {
		t.Skipf("installs the package into this system: set %s=1 (as root; .ci/run does)", envDpkgInstall)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s is set, but installing a package needs root", envDpkgInstall)
	}
	p := buildDeb(t)
	need(t, "apt-get")
	need(t, "dpkg-query")
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	if s := status(t); s != "" {
		t.Fatalf("csiactor is already known to dpkg (%s): this test would replace it; purge it first", s)
	}
	for _, path := range append(slices.Sorted(maps.Keys(wantFiles)), "/etc/csiactor", "/usr/share/csiactor") {
		if _, err := os.Lstat(path); err == nil {
			t.Fatalf("%s exists, though csiactor is not installed: this test would overwrite and delete it", path)
		}
	}
	_, dataErr := os.Stat("/var/lib/csiactor")
	t.Cleanup(func() {
		if s := status(t); s != "" {
			apt(t, "purge", "csiactor")
		}
	})

	out := apt(t, "install", "--no-install-recommends", abs)
	if got, want := status(t), "install ok installed"; got != want {
		t.Fatalf("after apt-get install: status %q, want %q\n%s", got, want, out)
	}
	if got := strings.TrimSpace(run(t, "dpkg-query", "-W", "-f=${Version}", "csiactor")); got != wantDebVersion {
		t.Errorf("installed version %q, want %q", got, wantDebVersion)
	}
	sample, err := os.ReadFile("../examples/config/csiactor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(sample)
	if s, want := run(t, "dpkg", "-s", "csiactor"), "Conffiles:\n "+conffile+" "+hex.EncodeToString(sum[:]); !strings.Contains(s, want) {
		t.Errorf("dpkg -s csiactor does not show %q:\n%s", want, s)
	}
	listed := strings.Split(run(t, "dpkg", "-L", "csiactor"), "\n")
	for path, mode := range wantFiles {
		if !slices.Contains(listed, path) {
			t.Errorf("dpkg -L csiactor does not list %s", path)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("installed, but: %v", err)
		} else if fi.Mode().String() != mode {
			t.Errorf("%s is installed with mode %s, want %s", path, fi.Mode(), mode)
		}
	}
	if got, err := os.ReadFile(conffile); err != nil || !bytes.Equal(got, sample) {
		t.Errorf("%s is not the sample config (err %v)", conffile, err)
	}
	if out := run(t, "/usr/bin/csiactor", "version"); !strings.HasPrefix(out, "csiactor "+testVersion+" ") {
		t.Errorf("the installed csiactor version = %q, want %s", out, testVersion)
	}
	if pids := testbin.ProcessesWith("/usr/bin/csiactor"); len(pids) > 0 {
		t.Errorf("the installed package started csiactor (pids %v); it must start nothing", pids)
	}

	// Remove keeps the conffile, edited as an operator would.
	edited := append(slices.Clone(sample), "# edited\n"...)
	if err := os.WriteFile(conffile, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	apt(t, "remove", "csiactor")
	if got, want := status(t), "deinstall ok config-files"; got != want {
		t.Errorf("after apt-get remove: status %q, want %q", got, want)
	}
	if got, err := os.ReadFile(conffile); err != nil || !bytes.Equal(got, edited) {
		t.Errorf("after remove, the edited %s is not kept (err %v)", conffile, err)
	}
	for path := range wantFiles {
		if _, err := os.Lstat(path); path != conffile && err == nil {
			t.Errorf("after remove, %s is still there", path)
		}
	}

	// Purge removes the rest, and leaves the data dir as it was.
	apt(t, "purge", "csiactor")
	if got := status(t); got != "" {
		t.Errorf("after apt-get purge: status %q, want none", got)
	}
	for _, path := range append(slices.Sorted(maps.Keys(wantFiles)), "/etc/csiactor", "/usr/share/csiactor", "/usr/share/doc/csiactor") {
		if _, err := os.Lstat(path); err == nil {
			t.Errorf("after purge, %s is still there", path)
		}
	}
	if _, err := os.Stat("/var/lib/csiactor"); (err == nil) != (dataErr == nil) {
		t.Errorf("purge changed whether /var/lib/csiactor exists (before: %v, after: %v)", dataErr, err)
	}
}
