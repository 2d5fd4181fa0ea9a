package cli

import (
	"context"
	"flag"
	"fmt"
	goruntime "runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print csiactor's version",
		usage:   "csiactor version [flags]",
		help:    `Prints the version of this csiactor binary, its VCS revision when known, and its Go version.`,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(_ context.Context, args []string) error {
				if err := wantArgs(args); err != nil {
					return err
				}
				v := versionInfo(e.version, e.revision)
				if *asJSON {
					return printJSON(e.stdout, v)
				}
				fmt.Fprintf(e.stdout, "csiactor %s", v.Version)
				if v.Revision != "" {
					fmt.Fprintf(e.stdout, " (%s)", v.Revision)
				}
				fmt.Fprintf(e.stdout, " %s\n", v.Go)
				return nil
			}
		},
	}
}

type version struct {
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Go       string `json:"go"`
}

// versionInfo returns the given version, else the module version from the
// build info ("(devel)" for a build from a checkout), with the given
// revision, else the VCS revision when the build recorded one.
func versionInfo(given, revision string) version {
	v := version{Version: given, Revision: revision, Go: goruntime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && v.Revision == "" {
				v.Revision = s.Value
				if len(v.Revision) > 12 {
					v.Revision = v.Revision[:12]
				}
			}
		}
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	return v
}

// buildInfo is the csiactor_build_info gauge: always 1, with the version,
// VCS revision and Go version of the running agent as labels, for joins in
// queries and for spotting hosts that run an old build.
func buildInfo(v version) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "csiactor_build_info",
		Help: "The running agent's build: always 1, labelled with its version, VCS revision and Go version.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(v.Version, v.Revision, v.Go).Set(1)
	return g
}
