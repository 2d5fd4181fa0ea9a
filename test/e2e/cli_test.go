package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// TestCLI_Run_ExitCodes runs the binary with mistakes a user makes and
// checks the exit code (0 ok, 1 error, 2 usage) and that the message names
// what is wrong. With no agent running, client commands fail with 1.
func TestCLI_Run_ExitCodes(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	badConfig := filepath.Join(h.base, "bad.yaml")
	if err := os.WriteFile(badConfig, []byte("data_dir: /tmp/x\nplugins:\n  rpc_timeout: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknownKey := filepath.Join(h.base, "unknown.yaml")
	if err := os.WriteFile(unknownKey, []byte("data_dir: /tmp/x\nlogs:\n  level: info\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // substring of stdout
		stderr string // substring of stderr
	}{
		{"version", []string{"version"}, 0, "csiactor", ""},
		{"help", []string{"help"}, 0, "Commands:", ""},
		{"no command", nil, 2, "", "missing command"},
		{"unknown command", []string{"bogus"}, 2, "", `unknown command "bogus"`},
		{"unknown subcommand", []string{"volume", "bogus"}, 2, "", `unknown command "bogus"`},
		{"unknown flag", []string{"status", "-bogus"}, 2, "", "-bogus"},
		{"missing argument", []string{"volume", "status"}, 2, "", "missing ID"},
		{"extra argument", []string{"status", "extra"}, 2, "", `unexpected argument "extra"`},
		{"claim without alloc", []string{"volume", "claim", "data1"}, 2, "", "-alloc is required"},
		{"bad log level", []string{"agent", "-log-level", "loud"}, 2, "", `-log-level "loud"`},
		{"no agent", []string{"status"}, 1, "", "cannot reach the agent"},
		{"bad address", []string{"status", "-address", "ftp://host"}, 1, "", "ftp://host"},
		{"config value", []string{"agent", "-config", badConfig}, 1, "", "line 3: plugins.rpc_timeout"},
		{"config key", []string{"agent", "-config", unknownKey}, 1, "", "line 2: logs: unknown key"},
		{"config file missing", []string{"agent", "-config", filepath.Join(h.base, "none.yaml")}, 1, "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.cli(tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("want exit %d, %q on stdout and %q on stderr; got %s", tc.code, tc.stdout, tc.stderr, r)
			}
		})
	}
}
