package cli

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/internal/tlsfiles"
	"github.com/csiactor/csiactor/runtime"
)

// Agent is the runtime as the agent command runs it: the Backend the API
// serves, plus Start and Shutdown.
type Agent interface {
	api.Backend
	// Start restores the persisted state, registers the configured
	// allocations and starts supervising them. It returns once the runtime
	// can serve requests, or with the error that keeps it from starting.
	Start(ctx context.Context) error
	// Shutdown stops the runtime and returns when its goroutines,
	// processes and sockets are gone, or when ctx ends. The agent command
	// calls it exactly once, also when Start was not called or failed.
	Shutdown(ctx context.Context) error
}

// AgentDeps is what the agent command gives a NewAgentFunc besides the
// config.
type AgentDeps struct {
	// Log is the agent's logger, set up from log.level and log.format.
	Log *logrus.Entry
	// Registerer is the registry that /metrics serves. The Go and process
	// collectors are in it already.
	Registerer prometheus.Registerer
}

// NewAgentFunc builds the runtime from a validated config with its
// defaults filled in. main passes one to Run with WithAgent.
type NewAgentFunc func(cfg runtime.Config, deps AgentDeps) (Agent, error)

// Timeouts of the agent's shutdown.
const (
	serverShutdownTimeout  = 10 * time.Second
	runtimeShutdownTimeout = 2 * time.Minute
)

var errNoAgent = errors.New("this csiactor binary has no agent runtime (cli.WithAgent was given nil)")

// NewRuntimeAgent is the agent `csiactor agent` runs unless WithAgent says
// otherwise: the runtime package's Runtime.
func NewRuntimeAgent(cfg runtime.Config, deps AgentDeps) (Agent, error) {
	rt, err := runtime.New(cfg, runtime.Options{Log: deps.Log, Registerer: deps.Registerer})
	if err != nil || cfg.Docker == nil {
		return rt, err
	}
	return &dockerAgent{Runtime: rt, log: deps.Log.WithField("component", "docker")}, nil
}

var _ Agent = (*runtime.Runtime)(nil)

// dockerAgent is the runtime with the Docker volume drivers of its docker
// section served on top: started after it, stopped before it.
type dockerAgent struct {
	*runtime.Runtime
	log    *logrus.Entry
	docker *dockerplugin.Server
}

func (a *dockerAgent) Start(ctx context.Context) error {
	if err := a.Runtime.Start(ctx); err != nil {
		return err
	}
	d, err := dockerplugin.Start(ctx, a.Runtime, a.log)
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	a.docker = d
	return nil
}

func (a *dockerAgent) Shutdown(ctx context.Context) error {
	var err error
	if a.docker != nil {
		err = a.docker.Shutdown(ctx)
	}
	return errors.Join(err, a.Runtime.Shutdown(ctx))
}

// BootIDFileEnv names an environment variable that, when set, is the file
// the agent reads the host's boot ID from instead of
// /proc/sys/kernel/random/boot_id. It is a test and ops seam: tests
// simulate a reboot by changing the file's content.
const BootIDFileEnv = "CSIACTOR_BOOT_ID_FILE"

// SELinuxFileEnv names an environment variable that, when set, is the file
// whose existence says the host has SELinux, instead of
// /sys/fs/selinux/enforce (or a selinuxfs mount). It is a test seam.
const SELinuxFileEnv = "CSIACTOR_SELINUX_FILE"

// DevAllocationID is the ID (and plugin name) of the example plugin's
// allocation under -dev.
const DevAllocationID = "example"

func agentCommand() *command {
	return &command{
		name:    "agent",
		summary: "run the agent",
		usage:   "csiactor agent [-config FILE] [-dev] [-data-dir DIR] [-http-addr ADDR] [-log-level L] [-log-format text|json]",
		help: `Runs the agent until interrupted (SIGINT or SIGTERM): it supervises the CSI
plugin allocations, serves the full API on the unix socket <data_dir>/api.sock
(or api.socket; mode 0600), and /metrics, GET /v1/health and GET /v1/ready on
the TCP address (api.http_addr, default 127.0.0.1:7460), with the full API
there too for requests bearing the token in api.token_file. With api.tls
the TCP address speaks TLS (https://; mutual with api.tls.client_ca_file),
and a certificate whose files change is served without a restart.

On start it checks the host against its store: after a reboot (the boot ID
in /proc/sys/kernel/random/boot_id changed; $CSIACTOR_BOOT_ID_FILE names
another file, for tests) every claim is published again, and a published
claim whose target or staging path is not mounted is too. GET /v1/ready
answers 503 until that is done.

Exec-managed plugins keep running when the agent stops, crashes or is
upgraded (FUSE mounts die with their plugin), each with a log shim that
keeps its output in <data_dir>/plugins/<alloc>/output.log; the next agent
adopts them. Deregistration, removal from the config file, the exit of
-dev and plugins.stop_on_agent_exit stop them.

With plugins.registration_dir set to a kubelet plugin registration
directory, CSI drivers deployed with node-driver-registrar register
themselves there: each becomes an attached node allocation of the driver's
name (source "registration"), deregistered when its registration socket goes.

A second SIGINT or SIGTERM during the shutdown exits at once, leaving
whatever was still being stopped running, and a -dev data dir behind.

Flags override the config file, which overrides the defaults.

-dev runs the embedded default: a fresh temporary data dir (unless -data-dir
is given; removed on exit) and the example CSI plugin of this binary,
registered as the exec-managed monolith allocation "example", stopped when
the agent exits. It prints the CSIACTOR_ADDR to use.`,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			configFile := fs.String("config", "", "YAML or JSON config `file`")
			dev := fs.Bool("dev", false, "run with a temporary data dir and the example plugin")
			dataDir := fs.String("data-dir", "", "data `dir` (config data_dir; default "+runtime.DefaultDataDir+")")
			httpAddr := fs.String("http-addr", "", "TCP `address` for metrics and health (config api.http_addr; default "+runtime.DefaultHTTPAddr+")")
			logLevel := fs.String("log-level", "", "log `level`: trace, debug, info, warn or error (config log.level; default info)")
			logFormat := fs.String("log-format", "", "log `format`: text or json (config log.format; default text)")
			return func(ctx context.Context, args []string) error {
				if err := wantArgs(args); err != nil {
					return err
				}
				set := map[string]bool{}
				fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
				if set["log-level"] {
					if _, err := parseLogLevel(*logLevel); err != nil {
						return usagef("-log-level %q: want trace, debug, info, warn or error", *logLevel)
					}
				}
				if set["log-format"] && *logFormat != "text" && *logFormat != "json" {
					return usagef("-log-format %q: want text or json", *logFormat)
				}
				if set["data-dir"] && *dataDir == "" {
					return usagef("-data-dir must not be empty")
				}
				if set["http-addr"] && *httpAddr == "" {
					// Empty would silently mean the default address.
					return usagef("-http-addr must not be empty")
				}

				cfg := runtime.DefaultConfig()
				if *configFile != "" {
					var err error
					if cfg, err = runtime.LoadConfigFile(*configFile); err != nil {
						return err
					}
				}
				if set["data-dir"] {
					abs, err := filepath.Abs(*dataDir)
					if err != nil {
						return fmt.Errorf("-data-dir: %w", err)
					}
					cfg.DataDir = abs
				}
				if set["http-addr"] {
					cfg.API.HTTPAddr = *httpAddr
				}
				if set["log-level"] {
					cfg.Log.Level = *logLevel
				}
				if set["log-format"] {
					cfg.Log.Format = *logFormat
				}
				if f := e.getenv(BootIDFileEnv); f != "" {
					cfg.Host.BootIDFile = f
				}
				if f := e.getenv(SELinuxFileEnv); f != "" {
					cfg.Host.SELinuxFile = f
				}
				var tempDir string
				if *dev {
					if !set["data-dir"] {
						dir, err := os.MkdirTemp("", "csiactor-dev-")
						if err != nil {
							return fmt.Errorf("dev data dir: %w", err)
						}
						tempDir, cfg.DataDir = dir, dir
						defer func() {
							if err := removeDevDir(tempDir); err != nil {
								fmt.Fprintf(e.stderr, "csiactor agent: %s\n", err)
							}
						}()
					}
					for i, a := range cfg.Allocations {
						if a.ID == DevAllocationID {
							return fmt.Errorf("-dev: allocations[%d] of the config file has the ID %q, which -dev gives the example plugin", i, DevAllocationID)
						}
					}
					// Nothing outlives -dev: its plugins stop with it.
					cfg.Plugins.StopOnAgentExit = true
					// The web UI, with a fresh token in the data dir
					// unless the config file names one.
					cfg.API.UI = true
					if cfg.API.TokenFile == "" {
						tf, err := writeDevToken(cfg.DataDir)
						if err != nil {
							return err
						}
						cfg.API.TokenFile = tf
					}
					exe, err := os.Executable()
					if err != nil {
						return fmt.Errorf("dev: find this binary for the example plugin: %w", err)
					}
					cfg.Allocations = append(cfg.Allocations, runtime.AllocationConfig{
						ID: DevAllocationID,
						AllocationSpec: runtime.AllocationSpec{
							Plugin:  DevAllocationID,
							Type:    runtime.TypeMonolith,
							Command: []string{exe, "example-plugin", "-state-dir", filepath.Join(cfg.DataDir, "example-plugin"), "-log-format", "json"},
						},
					})
				}
				cfg = cfg.WithDefaults()
				if err := cfg.Validate(); err != nil {
					return fmt.Errorf("config: %w", err)
				}
				return e.runAgent(ctx, cfg, *dev)
			}
		},
	}
}

func parseLogLevel(s string) (logrus.Level, error) {
	switch s {
	case "trace", "debug", "info", "warn", "error":
		return logrus.ParseLevel(s)
	}
	return 0, fmt.Errorf("log level %q: want trace, debug, info, warn or error", s)
}

// newLogger returns the agent's logger, writing to e.stderr.
func (e *env) newLogger(cfg runtime.Config) (*logrus.Logger, error) {
	l := logrus.New()
	l.SetOutput(e.stderr)
	level, err := parseLogLevel(cfg.Log.Level)
	if err != nil {
		return nil, err
	}
	l.SetLevel(level)
	if cfg.Log.Format == "json" {
		l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	} else {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	}
	return l, nil
}

// runAgent runs the runtime and its API servers until ctx ends, then shuts
// them down in order: the servers (so no request reaches a stopping
// runtime), then the runtime.
func (e *env) runAgent(ctx context.Context, cfg runtime.Config, dev bool) (err error) {
	if e.newAgent == nil {
		return errNoAgent
	}
	logger, err := e.newLogger(cfg)
	if err != nil {
		return err
	}
	lg := logrus.NewEntry(logger)
	errLogW := logger.WriterLevel(logrus.WarnLevel)
	defer errLogW.Close()
	httpErrLog := log.New(errLogW, "", 0)

	tokens, err := api.NewTokens(api.TokenSpecs(cfg.API), lg.WithField("component", "api"))
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// The TLS files load before anything starts; recordEvent is set once
	// the agent is up, before the reloader runs.
	var recordEvent func(runtime.Event)
	var reloader *tlsfiles.Reloader
	if cfg.API.TLS != nil {
		tlsLog := lg.WithField("component", "api-tls")
		reloader, err = tlsfiles.NewReloader(cfg.API.TLS.Files(), func(leaf *x509.Certificate, err error) {
			reportTLSReload(tlsLog, recordEvent, leaf, err)
		})
		if err != nil {
			return fmt.Errorf("config: %w", runtime.TLSFileError(err))
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(versionInfo(e.version, e.revision)))
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: httpErrLog})

	agent, err := e.newAgent(cfg, AgentDeps{Log: lg, Registerer: reg})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	shutdownAgent := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), runtimeShutdownTimeout)
		defer cancel()
		if err := agent.Shutdown(sctx); err != nil {
			return fmt.Errorf("agent shutdown: %w", err)
		}
		return nil
	}

	// Listen before starting, so that a second agent on the same data dir
	// fails before it touches any plugin.
	socket := cfg.APISocketPath()
	unixL, err := api.ListenUnix(socket)
	if err != nil {
		return errors.Join(err, shutdownAgent())
	}
	tcpL, err := net.Listen("tcp", cfg.API.HTTPAddr)
	if err != nil {
		unixL.Close()
		return errors.Join(fmt.Errorf("api.http_addr: %w", err), shutdownAgent())
	}
	if err := agent.Start(ctx); err != nil {
		unixL.Close()
		tcpL.Close()
		return errors.Join(fmt.Errorf("agent start: %w", err), shutdownAgent())
	}
	recordEvent = func(ev runtime.Event) {
		if rec, ok := agent.(api.EventRecorder); ok {
			if err := rec.RecordEvent(ev); err != nil {
				lg.WithError(err).WithField("event", ev.Type).Warn("event not recorded")
			}
		}
	}
	scheme := "http"
	var reloaderDone sync.WaitGroup
	stopReloader := func() {}
	if reloader != nil {
		scheme = "https"
		tcpL = tls.NewListener(tcpL, reloader.ServerConfig())
		rctx, cancel := context.WithCancel(context.Background())
		reloaderDone.Go(func() { reloader.Run(rctx) })
		stopReloader = func() { cancel(); reloaderDone.Wait() }
	}
	defer stopReloader()
	if cfg.API.InsecureTCPInUse() {
		const msg = "api.insecure_tcp: the API token crosses the network in clear on a non-loopback api.http_addr; set api.tls"
		lg.WithField("http_addr", cfg.API.HTTPAddr).Warn(msg)
		recordEvent(runtime.Event{Type: runtime.EventInsecureTCP, Message: msg + " (" + cfg.API.HTTPAddr + ")"})
	}

	// Handlers see srvCtx, which ends when shutdown begins, so that
	// followed event streams end instead of holding the shutdown up.
	srvCtx, cancelSrv := context.WithCancel(context.Background())
	defer cancelSrv()
	opts := api.Options{Log: lg.WithField("component", "api"), Metrics: metrics}
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			BaseContext:       func(net.Listener) context.Context { return srvCtx },
			ErrorLog:          httpErrLog,
		}
	}
	unixSrv := newServer(api.NewHandler(agent, opts))
	tcpOpts := opts
	tcpOpts.UI = cfg.API.UI
	tcpOpts.Tokens = tokens
	tcpSrv := newServer(api.NewTCPHandler(agent, "", tcpOpts))
	errc := make(chan error, 2)
	serve := func(srv *http.Server, l net.Listener) {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve %s: %w", l.Addr(), err)
			return
		}
		errc <- nil
	}
	go serve(unixSrv, unixL)
	go serve(tcpSrv, tcpL)

	addr := "unix://" + socket
	tcpAddr := scheme + "://" + tcpL.Addr().String()
	fmt.Fprintf(e.stdout, "csiactor agent: API on %s\n", addr)
	if tokens.Configured() {
		fmt.Fprintf(e.stdout, "csiactor agent: metrics, health and the API (with the bearer token) on %s\n", tcpAddr)
	} else {
		fmt.Fprintf(e.stdout, "csiactor agent: metrics and health on %s\n", tcpAddr)
	}
	if cfg.API.UI && cfg.API.TokenFile != "" {
		fmt.Fprintf(e.stdout, "csiactor agent: web UI on %s/ui/ (sign in with the token in %s)\n", tcpAddr, cfg.API.TokenFile)
	} else if cfg.API.UI {
		fmt.Fprintf(e.stdout, "csiactor agent: web UI on %s/ui/ (sign in with a token of api.tokens)\n", tcpAddr)
	}
	if dev {
		fmt.Fprintf(e.stdout, "csiactor agent: dev mode, data dir %s (removed on exit)\n\n    export %s=%s\n\n", cfg.DataDir, AddressEnv, addr)
	}
	lg.WithFields(logrus.Fields{"socket": socket, "http_addr": tcpL.Addr().String(), "tls": reloader != nil, "data_dir": cfg.DataDir}).Info("agent running")

	var serveErr error
	pending := 2
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		pending--
	}
	lg.Info("agent shutting down")
	cancelSrv()
	sctx, cancel := context.WithTimeout(context.Background(), serverShutdownTimeout)
	defer cancel()
	errs := []error{serveErr}
	for _, srv := range []*http.Server{unixSrv, tcpSrv} {
		if err := srv.Shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("stop API server: %w", err), srv.Close())
		}
	}
	for ; pending > 0; pending-- {
		errs = append(errs, <-errc)
	}
	stopReloader()
	errs = append(errs, shutdownAgent())
	lg.Info("agent stopped")
	return errors.Join(errs...)
}

// reportTLSReload logs and records the outcome of loading changed api.tls
// files (see tlsfiles.Reloader).
func reportTLSReload(lg *logrus.Entry, record func(runtime.Event), leaf *x509.Certificate, err error) {
	var ev runtime.Event
	if err != nil {
		err = runtime.TLSFileError(err)
		lg.WithError(err).Error("api.tls files changed but do not load; serving the previous certificate")
		ev = runtime.Event{Type: runtime.EventTLSReloadFailed, Message: err.Error() + "; serving the previous certificate"}
	} else {
		ev = runtime.Event{Type: runtime.EventTLSReloaded, Message: fmt.Sprintf("serving the new api.tls certificate %q (serial %s, expires %s)",
			leaf.Subject.String(), leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))}
		lg.Info(ev.Message)
	}
	record(ev)
}

// DevTokenFile is the file in a -dev data dir with the API token that -dev
// makes up for the web UI (unless the config file has api.token_file).
const DevTokenFile = "ui-token"

// writeDevToken writes a random API token to DevTokenFile in dataDir
// (mode 0600) and returns the file's path.
func writeDevToken(dataDir string) (string, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("dev data dir: %w", err)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("dev token: %w", err)
	}
	p := filepath.Join(dataDir, DevTokenFile)
	if err := os.WriteFile(p, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("dev token: %w", err)
	}
	return p, nil
}
