// Command csiactor is the csiactor agent and its command line client. All
// of it lives in package cli; main only wires signals and the exit code.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
)

// version and revision are stamped by `make build` (-ldflags "-X
// main.version=... -X main.revision=...", from git describe and git
// rev-parse); empty, `csiactor version` falls back to the module version
// and the VCS stamp in the build info.
var version, revision string

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first SIGINT or SIGTERM ends ctx: the agent shuts down in
		// order, a followed event stream ends. A second one ends the
		// process at once instead of waiting for, say, a plugin that
		// ignores SIGTERM (exec-managed plugins run in sessions of their
		// own and outlive the agent; the next one adopts them). The signal
		// is caught rather than left to its default action, which is
		// "ignore" for a background job of a non-interactive shell.
		<-ctx.Done()
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		stop()
		s := <-again
		fmt.Fprintf(os.Stderr, "csiactor: %s again: exiting without waiting for the shutdown\n", s)
		os.Exit(cli.ExitError)
	}()
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, cli.WithVersion(version), cli.WithRevision(revision))
	stop()
	os.Exit(code)
}
