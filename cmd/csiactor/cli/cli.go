// Package cli is the csiactor command line: the agent command and the
// client commands that drive an agent through its API. cmd/csiactor's main
// only calls [Run] and exits with its code.
//
// # Basics
//
// Every client command talks to the agent at -address, else $CSIACTOR_ADDR,
// else DefaultAddress, and prints aligned tables, or the API's JSON with
// -json. Exit codes: 0 success, 1 error, 2 usage error (unknown command or
// flag, missing or extra arguments).
//
// The agent command builds a [runtime.Config] from its flags and config file
// and runs the runtime through the [NewAgentFunc] given with [WithAgent].
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// DefaultAddress is the agent address the client commands use when neither
// -address nor CSIACTOR_ADDR is set: the API socket in the default data
// dir.
const DefaultAddress = "unix://" + runtime.DefaultDataDir + "/" + runtime.APISocketName

// AddressEnv is the environment variable that holds the agent address.
const AddressEnv = "CSIACTOR_ADDR"

// TokenEnv is the environment variable that holds the API token for the
// agent's TCP address (-token-file takes precedence).
const TokenEnv = "CSIACTOR_TOKEN"

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Option configures Run.
type Option func(*env)

// WithAgent sets how the agent command builds the runtime. Without it,
// `csiactor agent` fails.
func WithAgent(f NewAgentFunc) Option { return func(e *env) { e.newAgent = f } }

// WithGetenv replaces os.Getenv, for tests.
func WithGetenv(getenv func(string) string) Option { return func(e *env) { e.getenv = getenv } }

// WithVersion sets the version that `csiactor version` prints (by default
// the module version from the build info).
func WithVersion(v string) Option { return func(e *env) { e.version = v } }

// WithStdin replaces os.Stdin (read by "volume register -f -"), for
// tests.
func WithStdin(r io.Reader) Option { return func(e *env) { e.stdin = r } }

// WithRevision sets the VCS revision that `csiactor version` prints (by
// default the one Go stamped into the build info, if any).
func WithRevision(r string) Option { return func(e *env) { e.revision = r } }

// env is what every command runs with.
type env struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	getenv         func(string) string
	newAgent       NewAgentFunc
	version        string
	revision       string
}

// command is one node of the command tree: a group with subcommands, or a
// leaf with run.
type command struct {
	name    string
	summary string // one line, for the parent's usage
	usage   string // "csiactor volume claim [flags] VOLUME"
	help    string // what it does and what its flags mean
	hidden  bool
	subs    []*command // set for a group
	// setup, set for a leaf, registers the leaf's flags and returns the
	// function that runs it with the positional arguments.
	setup func(fs *flag.FlagSet, e *env) func(ctx context.Context, args []string) error
}

func commands() *command {
	return &command{
		name:  "csiactor",
		usage: "csiactor <command> [flags] [args]",
		help: `csiactor supervises CSI plugins and drives the volume lifecycle through them.
Run "csiactor <command> -h" for a command's flags.

Environment of the client commands:
  ` + AddressEnv + `   the agent's address, unless -address is given
                  (unix:///path/api.sock, http://host:port or
                  https://host:port)
  ` + TokenEnv + `  the API token for an agent's TCP address, unless
                  -token-file is given
  ` + CACertEnv + `
                  for an https:// address: the CA that signed the
                  agent's certificate, unless -ca-cert is given
  ` + ClientCertEnv + `, ` + ClientKeyEnv + `
                  for an https:// address: the client certificate and
                  its key, unless -client-cert and -client-key are given

Exit codes: 0 success, 1 error (the agent refused, or is unreachable),
2 usage error.`,
		subs: []*command{
			agentCommand(),
			statusCommand(),
			pluginCommand(),
			allocCommand(),
			volumeCommand(),
			snapshotCommand(),
			eventsCommand(),
			nodeCommand(),
			secretsCommand(),
			versionCommand(),
			completionCommand(),
			examplePluginCommand(),
		},
	}
}

// Run runs the csiactor command line with args (without the program name),
// writing to stdout and stderr, and returns the exit code: ExitOK,
// ExitError or ExitUsage. ctx ends long-running commands (the agent,
// events -follow); main cancels it on SIGINT and SIGTERM.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	e := &env{stdout: stdout, stderr: stderr, stdin: os.Stdin, getenv: os.Getenv, newAgent: NewRuntimeAgent}
	for _, o := range opts {
		o(e)
	}
	return e.dispatch(ctx, commands(), nil, args)
}

// usageError is a command line mistake: exit code 2, with the command's
// usage.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return &usageError{msg: fmt.Sprintf(format, a...)} }

func (e *env) dispatch(ctx context.Context, c *command, path []string, args []string) int {
	path = append(path, c.name)
	if c.subs != nil {
		if len(args) == 0 && len(path) == 1 {
			// Plain "csiactor": the full usage is the most useful answer.
			fmt.Fprintf(e.stderr, "%s: missing command\n\n", strings.Join(path, " "))
			e.printUsage(e.stderr, c)
			return ExitUsage
		}
		if len(args) == 0 {
			return e.usageMistake(path, "missing command")
		}
		switch args[0] {
		case "-h", "-help", "--help", "help":
			e.printUsage(e.stdout, c)
			return ExitOK
		}
		for _, s := range c.subs {
			if s.name == args[0] {
				return e.dispatch(ctx, s, path, args[1:])
			}
		}
		return e.usageMistake(path, fmt.Sprintf("unknown command %q", args[0]))
	}
	fs := flag.NewFlagSet(strings.Join(path, " "), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.setup(fs, e)
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		e.printUsage(e.stdout, c, fs)
		return ExitOK
	}
	if err == nil {
		err = run(ctx, pos)
	}
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue), isFlagError(err):
		return e.usageMistake(path, err.Error())
	}
	fmt.Fprintf(e.stderr, "csiactor: %s\n", err.Error())
	return ExitError
}

// usageMistake reports a command line mistake of the command at path: the
// error, then one line that says where the full help is (not the help
// itself, which would bury the error). It returns ExitUsage.
func (e *env) usageMistake(path []string, msg string) int {
	cmd := strings.Join(path, " ")
	fmt.Fprintf(e.stderr, "%s: %s\nrun '%s -h' for usage\n", cmd, msg, cmd)
	return ExitUsage
}

// flagError marks errors from the flag package (unknown flag, bad value).
type flagError struct{ err error }

func (f *flagError) Error() string { return f.err.Error() }
func (f *flagError) Unwrap() error { return f.err }

// explainFlagError replaces the flag package's "parse error" (a value
// that is not a number or duration) with what the flag wants.
func explainFlagError(fs *flag.FlagSet, err error) error {
	msg, ok := strings.CutSuffix(err.Error(), ": parse error")
	if !ok {
		return err
	}
	// msg is `invalid value "x" for flag -name`.
	i := strings.LastIndex(msg, " -")
	if i < 0 {
		return err
	}
	f := fs.Lookup(msg[i+2:])
	if f == nil {
		return err
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	var want string
	switch g.Get().(type) {
	case int, int64, uint, uint64:
		want = "want a whole number"
	case float64:
		want = "want a number"
	case time.Duration:
		want = "want a duration like 30s, 5m or 1h"
	case bool:
		want = "want true or false"
	default:
		return err
	}
	return fmt.Errorf("%s: %s", msg, want)
}

func isFlagError(err error) bool {
	var fe *flagError
	return errors.As(err, &fe)
}

// parseInterspersed parses flags anywhere among the positional arguments
// ("volume status vol1 -json" works). Everything after "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos, rest []string
	for i, a := range args {
		if a == "--" {
			args, rest = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &flagError{explainFlagError(fs, err)}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if rest != nil {
		pos = append(pos, "--")
		pos = append(pos, rest...)
	}
	return pos, nil
}

func (e *env) printUsage(w io.Writer, c *command, fs ...*flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s\n", c.usage)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	if len(c.subs) > 0 {
		fmt.Fprintln(w, "\nCommands:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, s := range c.subs {
			if !s.hidden {
				fmt.Fprintf(tw, "  %s\t%s\n", s.name, s.summary)
			}
		}
		tw.Flush()
	}
	if len(fs) > 0 && fs[0] != nil {
		var names []string
		fs[0].VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if len(names) > 0 {
			fmt.Fprintln(w, "\nFlags:")
			sort.Strings(names)
			for _, n := range names {
				f := fs[0].Lookup(n)
				typ, text := flag.UnquoteUsage(f)
				line := "  -" + n
				if typ != "" {
					line += " " + typ
				}
				fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(text, "\n", "\n    \t"))
				if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
					fmt.Fprintf(w, " (default %q)", f.DefValue)
				}
				fmt.Fprintln(w)
			}
		}
	}
}

// clientFlags are the flags of every command that talks to an agent.
type clientFlags struct {
	address   string
	tokenFile string
	tls       tlsFlags
	json      bool
}

func addClientFlags(fs *flag.FlagSet) *clientFlags {
	f := &clientFlags{}
	fs.StringVar(&f.address, "address", "", "agent `address`: unix:///path/api.sock, http://host:port or https://host:port\n(default $"+AddressEnv+", else "+DefaultAddress+")")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the API token, for an agent's TCP address\n(default $"+TokenEnv+" holds the token itself)")
	fs.BoolVar(&f.json, "json", false, "print the API's JSON instead of a table")
	f.tls.register(fs)
	return f
}

// client returns an API client for the flags, the environment and the
// default, in that order, and says where the address and the token came
// from, for error messages.
func (e *env) client(f *clientFlags) (c *api.Client, addrFrom, tokenFrom string, err error) {
	addr, addrFrom := f.address, "-address"
	if addr == "" {
		addr, addrFrom = e.getenv(AddressEnv), "$"+AddressEnv
	}
	if addr == "" {
		addr, addrFrom = DefaultAddress, "the default address"
	}
	var opts []api.ClientOption
	switch {
	case f.tokenFile != "":
		tok, err := api.ReadTokenFile(f.tokenFile)
		if err != nil {
			return nil, "", "", err
		}
		opts, tokenFrom = append(opts, api.WithToken(tok)), "-token-file"
	case e.getenv(TokenEnv) != "":
		opts, tokenFrom = append(opts, api.WithToken(e.getenv(TokenEnv))), "$"+TokenEnv
	}
	tlsCfg, err := e.clientTLS(&f.tls, addr)
	if err != nil {
		return nil, "", "", err
	}
	if tlsCfg != nil {
		opts = append(opts, api.WithTLSConfig(tlsCfg))
	}
	c, err = api.NewClient(addr, opts...)
	if err != nil {
		return nil, "", "", fmt.Errorf("%w (from %s)", err, addrFrom)
	}
	return c, addrFrom, tokenFrom, nil
}

// errInterrupted is what a client command says when SIGINT or SIGTERM ends
// it while it waits for the agent.
var errInterrupted = errors.New("interrupted; the agent carries on with a request it already received (a claim goes on to published)")

// explain adds what to do to the errors a command line user can fix: no
// agent at the address, or a missing or refused token.
func explain(err error, addrFrom, tokenFrom string) error {
	var ue *api.UnreachableError
	switch {
	case errors.As(err, &ue):
		return fmt.Errorf("%w (address from %s)", err, addrFrom)
	case errors.Is(err, api.ErrUnauthorized) && tokenFrom == "":
		return fmt.Errorf("%w: give the agent's API token with -token-file FILE or $%s", err, TokenEnv)
	case errors.Is(err, api.ErrUnauthorized):
		return fmt.Errorf("%w: the agent refused the token from %s", err, tokenFrom)
	}
	return err
}

// clientLeaf builds a leaf command that talks to an agent: it registers the
// client flags and the command's own, and hands run a connected client.
func clientLeaf(c *command, flags func(fs *flag.FlagSet) func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error) *command {
	c.setup = func(fs *flag.FlagSet, e *env) func(ctx context.Context, args []string) error {
		cf := addClientFlags(fs)
		run := flags(fs)
		return func(ctx context.Context, args []string) error {
			cl, addrFrom, tokenFrom, err := e.client(cf)
			if err != nil {
				return err
			}
			defer cl.Close()
			err = run(ctx, e, cl, cf, args)
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return errInterrupted
			}
			return e.explainTLS(explain(err, addrFrom, tokenFrom), &cf.tls)
		}
	}
	return c
}

// wantArgs checks the number of positional arguments.
func wantArgs(args []string, names ...string) error {
	switch {
	case len(args) < len(names):
		return usagef("missing %s", strings.Join(names[len(args):], " and "))
	case len(args) > len(names):
		return usagef("unexpected argument %q", args[len(names)])
	}
	return nil
}

// table writes aligned columns; call flush when done.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cols ...string) { fmt.Fprintln(t.tw, strings.Join(cols, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// orDash returns s, or "-" for an empty s, so that table columns stay
// aligned.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// plural returns "1 claim", "2 claims".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
