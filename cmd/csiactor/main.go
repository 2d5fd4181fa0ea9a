// Command csiactor is the csiactor agent and its command line client. All
// of it lives in package cli; main only wires signals and the exit code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
