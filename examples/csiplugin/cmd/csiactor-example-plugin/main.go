// Command csiactor-example-plugin runs csiactor's example CSI plugin (see
// package csiplugin) on a unix socket until SIGINT or SIGTERM.
//
//	CSI_ENDPOINT=unix:///run/example/csi.sock csiactor-example-plugin -state-dir /var/lib/example
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/sirupsen/logrus"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// run parses args, serves until SIGINT or SIGTERM and returns the exit
// code: 0 after a clean stop, 1 when the plugin fails, 2 for bad usage.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	fs := flag.NewFlagSet("csiactor-example-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := csiplugin.DefaultConfig()
	cfg.Endpoint = getenv("CSI_ENDPOINT")
	cfg.RegisterFlags(fs)
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	format := fs.String("log-format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "csiactor-example-plugin: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	if cfg.Endpoint == "" {
		return usage("-endpoint (or CSI_ENDPOINT) is required")
	}
	if cfg.StateDir == "" {
		return usage("-state-dir is required")
	}
	logger := logrus.New()
	logger.SetOutput(stderr)
	lvl, err := logrus.ParseLevel(*level)
	if err != nil {
		return usage("-log-level %q: want trace, debug, info, warn or error", *level)
	}
	logger.SetLevel(lvl)
	switch *format {
	case "text":
	case "json":
		logger.SetFormatter(&logrus.JSONFormatter{})
	default:
		return usage("-log-format %q: want text or json", *format)
	}
	cfg.Logger = logrus.NewEntry(logger)
	if err := cfg.Validate(); err != nil {
		return usage("%s", err.Error())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := csiplugin.Run(ctx, cfg); err != nil {
		cfg.Logger.WithField("error", err.Error()).Error("plugin failed")
		return 1
	}
	return 0
}
