package testbin

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/csiactor/csiactor/examples/csiplugin"
)

// RunExamplePlugin serves the example CSI plugin with the flags in args
// until SIGTERM or SIGINT, and returns the process's exit code: for a test
// binary that re-executes itself as the plugin (from its TestMain, when an
// environment variable of its own says so).
func RunExamplePlugin(args []string) int {
	cfg := csiplugin.DefaultConfig()
	fs := flag.NewFlagSet("example-plugin", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := csiplugin.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "example plugin:", err.Error())
		return 1
	}
	return 0
}
