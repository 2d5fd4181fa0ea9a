package cli_test

import (
	"testing"
)

// A malformed ID or name argument is a usage error (exit 2) naming the
// argument, found before any request is sent: the fake agent would have
// answered 400 (exit 1) had it been asked.
func TestRun_BadIDArgument_Usage(t *testing.T) {
	_, env := populated(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"volume", "status", "a/b"}, `csiactor volume status: ID: "a/b": use letters`},
		{[]string{"volume", "delete", ".."}, `csiactor volume delete: ID: "..": use letters`},
		{[]string{"volume", "release", "-alloc", "web-1", "-x"}, `flag provided but not defined: -x`},
		{[]string{"volume", "release", "-alloc", "web/1", "vol1"}, `csiactor volume release: -alloc: "web/1": use letters`},
		{[]string{"volume", "release", "-alloc", "web-1", "vol 1"}, `csiactor volume release: VOLUME: "vol 1": use letters`},
		{[]string{"volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-v"}, `flag provided but not defined: -v`},
		{[]string{"volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "_v"}, `csiactor volume create: ID: "_v": use letters`},
		{[]string{"alloc", "deregister", "a:b/c"}, `csiactor alloc deregister: ID: "a:b/c": use letters`},
		{[]string{"plugin", "status", "p q"}, `csiactor plugin status: NAME: "p q": use letters`},
	} {
		r := runCLI(t, env, tc.args...)
		r.want(t, 2, "")
		r.contains(t, "stderr", tc.want)
	}
}
