package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/csi"
)

// Shell completion is generated from the command tree itself (commands
// and each leaf's flag set), so it cannot fall out of step with the
// commands. The scripts are plain shell: each holds a table from a command
// path ("volume claim") to its subcommands, its flags and the flags that
// take a value, and a small function that walks the words typed so far
// through that table. No completion library: posener/complete (Nomad's)
// would re-run the binary on every TAB and needs its own flag
// declarations, which is a second copy of the tree to keep true; the
// table is a few lines of code here.

func completionCommand() *command {
	leaf := func(shell, install string, write func(io.Writer, []completionNode)) *command {
		return &command{
			name:    shell,
			summary: "print the " + shell + " completion script",
			usage:   "csiactor completion " + shell,
			help:    "Prints a " + shell + " script that completes csiactor's commands, subcommands and flags.\n\n" + install,
			setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
				return func(_ context.Context, args []string) error {
					if err := wantArgs(args); err != nil {
						return err
					}
					write(e.stdout, completionTree(commands()))
					return nil
				}
			},
		}
	}
	return &command{
		name:    "completion",
		summary: "print a shell completion script (bash, zsh or fish)",
		usage:   "csiactor completion bash|zsh|fish",
		help: `Prints a script that completes csiactor's commands, subcommands and flags
in bash, zsh or fish. Install it once:

  bash  csiactor completion bash > /etc/bash_completion.d/csiactor
        (or add 'source <(csiactor completion bash)' to ~/.bashrc)
  zsh   csiactor completion zsh > "${fpath[1]}/_csiactor"
        (or add 'source <(csiactor completion zsh)' to ~/.zshrc, after compinit)
  fish  csiactor completion fish > ~/.config/fish/completions/csiactor.fish`,
		subs: []*command{
			leaf("bash", "Install: csiactor completion bash > /etc/bash_completion.d/csiactor\n(or add 'source <(csiactor completion bash)' to ~/.bashrc).", writeBashCompletion),
			leaf("zsh", "Install: csiactor completion zsh > \"${fpath[1]}/_csiactor\"\n(or add 'source <(csiactor completion zsh)' to ~/.zshrc, after compinit).", writeZshCompletion),
			leaf("fish", "Install: csiactor completion fish > ~/.config/fish/completions/csiactor.fish", writeFishCompletion),
		},
	}
}

// completionNode is one command of the tree, as the scripts see it.
type completionNode struct {
	path   string   // "" for csiactor itself, "volume claim"
	subs   []string // subcommands of a group
	flags  []string // "-alloc", ... of a leaf, with -h
	valued []string // the flags that take a value
}

// completionTree flattens the visible command tree, depth first.
func completionTree(root *command) []completionNode {
	var out []completionNode
	var walk func(c *command, path string)
	walk = func(c *command, path string) {
		n := completionNode{path: path}
		if c.subs != nil {
			for _, s := range c.subs {
				if !s.hidden {
					n.subs = append(n.subs, s.name)
				}
			}
		} else {
			fs := flag.NewFlagSet(path, flag.ContinueOnError)
			c.setup(fs, &env{stdout: io.Discard, stderr: io.Discard})
			fs.VisitAll(func(f *flag.Flag) {
				n.flags = append(n.flags, "-"+f.Name)
				if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
					n.valued = append(n.valued, "-"+f.Name)
				}
			})
			n.flags = append(n.flags, "-h")
			sort.Strings(n.flags)
		}
		out = append(out, n)
		for _, s := range c.subs {
			if !s.hidden {
				walk(s, strings.TrimSpace(path+" "+s.name))
			}
		}
	}
	walk(root, "")
	return out
}

// flagValues are the words the flags that take one of a few values take,
// by flag name (a flag name means the same in every command). The access
// modes come from the csi package, which parses them.
func flagValues() []completionNode {
	var access []string
	for m := csi.AccessModeSingleNodeReaderOnly; ; m++ {
		s := m.String()
		if got, err := csi.ParseAccessMode(s); err != nil || got != m {
			break
		}
		access = append(access, s)
	}
	return []completionNode{
		{path: "access-mode", subs: access},
		{path: "attachment-mode", subs: []string{"block-device", "file-system"}},
		{path: "capability", subs: access},
		{path: "engine", subs: []string{container.Docker, container.Podman}},
		{path: "log-format", subs: []string{"json", "text"}},
		{path: "log-level", subs: []string{"debug", "error", "info", "trace", "warn"}},
		{path: "mode", subs: []string{"read", "write"}},
		{path: "pull", subs: []string{container.PullAlways, container.PullMissing, container.PullNever}},
		{path: "type", subs: []string{"controller", "monolith", "node"}},
	}
}

// writeCases writes one shell function per table that prints the words of
// a command path: a case statement in the syntax bash and zsh share.
func writeCases(w io.Writer, name string, nodes []completionNode, words func(completionNode) []string) {
	fmt.Fprintf(w, "%s() {\n    case \"$1\" in\n", name)
	for _, n := range nodes {
		if ws := words(n); len(ws) > 0 {
			fmt.Fprintf(w, "    %q) echo %q ;;\n", n.path, strings.Join(ws, " "))
		}
	}
	fmt.Fprintf(w, "    esac\n}\n")
}

func writeShTables(w io.Writer, nodes []completionNode) {
	writeCases(w, "_csiactor_subs", nodes, func(n completionNode) []string { return n.subs })
	writeCases(w, "_csiactor_flags", nodes, func(n completionNode) []string { return n.flags })
	writeCases(w, "_csiactor_valued", nodes, func(n completionNode) []string { return n.valued })
	writeCases(w, "_csiactor_values", flagValues(), func(n completionNode) []string { return n.subs })
}

func writeBashCompletion(w io.Writer, nodes []completionNode) {
	fmt.Fprint(w, "# bash completion for csiactor; generated by 'csiactor completion bash'.\n")
	writeShTables(w, nodes)
	fmt.Fprint(w, `_csiactor() {
    local cur prev cmdpath w i
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    cmdpath=
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [[ " $(_csiactor_subs "$cmdpath") " == *" $w "* ]]; then
            cmdpath=${cmdpath:+$cmdpath }$w
        fi
    done
    COMPREPLY=()
    if [[ $prev == -* && " $(_csiactor_valued "$cmdpath") " == *" $prev "* ]]; then
        local values
        values=$(_csiactor_values "${prev#-}")
        if [[ -n $values ]]; then
            COMPREPLY=($(compgen -W "$values" -- "$cur"))
        else
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_csiactor_flags "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_csiactor_subs "$cmdpath")" -- "$cur"))
    fi
}
complete -o filenames -F _csiactor csiactor
`)
}

func writeZshCompletion(w io.Writer, nodes []completionNode) {
	fmt.Fprint(w, "#compdef csiactor\n# zsh completion for csiactor; generated by 'csiactor completion zsh'.\n")
	writeShTables(w, nodes)
	// cmdpath, not path: zsh ties path to $PATH.
	fmt.Fprint(w, `_csiactor() {
    local cur prev cmdpath w i
    local -a subs
    cur=${words[CURRENT]}
    prev=${words[CURRENT-1]}
    cmdpath=
    for ((i = 2; i < CURRENT; i++)); do
        w=${words[i]}
        subs=(${=$(_csiactor_subs "$cmdpath")})
        if (( ${subs[(Ie)$w]} )); then
            cmdpath=${cmdpath:+$cmdpath }$w
        fi
    done
    subs=(${=$(_csiactor_valued "$cmdpath")})
    if [[ $prev == -* ]] && (( ${subs[(Ie)$prev]} )); then
        subs=(${=$(_csiactor_values "${prev#-}")})
        if (( $#subs )); then
            compadd -- $subs
        else
            _files
        fi
        return
    fi
    if [[ $cur == -* ]]; then
        subs=(${=$(_csiactor_flags "$cmdpath")})
    else
        subs=(${=$(_csiactor_subs "$cmdpath")})
    fi
    (( $#subs )) && compadd -- $subs
}
if [[ $funcstack[1] == _csiactor ]]; then
    _csiactor "$@"
else
    compdef _csiactor csiactor
fi
`)
}

func writeFishCompletion(w io.Writer, nodes []completionNode) {
	fmt.Fprint(w, "# fish completion for csiactor; generated by 'csiactor completion fish'.\n")
	table := func(name string, nodes []completionNode, words func(completionNode) []string) {
		fmt.Fprintf(w, "function %s\n    switch \"$argv[1]\"\n", name)
		for _, n := range nodes {
			if ws := words(n); len(ws) > 0 {
				fmt.Fprintf(w, "        case %s\n            printf '%%s\\n' %s\n", fishQuote(n.path), strings.Join(ws, " "))
			}
		}
		fmt.Fprint(w, "    end\nend\n")
	}
	table("__csiactor_subs", nodes, func(n completionNode) []string { return n.subs })
	table("__csiactor_flags", nodes, func(n completionNode) []string { return n.flags })
	table("__csiactor_valued", nodes, func(n completionNode) []string { return n.valued })
	table("__csiactor_values", flagValues(), func(n completionNode) []string { return n.subs })
	io.WriteString(w, `function __csiactor_complete
    set -l toks (commandline -opc)
    set -l cur (commandline -ct)
    set -l cmdpath ''
    for w in $toks[2..-1]
        if contains -- $w (__csiactor_subs "$cmdpath")
            set cmdpath (string trim -- "$cmdpath $w")
        end
    end
    if test (count $toks) -gt 1; and string match -q -- '-*' $toks[-1]; and contains -- $toks[-1] (__csiactor_valued "$cmdpath")
        set -l values (__csiactor_values (string sub -s 2 -- $toks[-1]))
        if test (count $values) -gt 0
            printf '%s\n' $values
        else
            __fish_complete_path $cur
        end
    else if string match -q -- '-*' $cur
        __csiactor_flags "$cmdpath"
    else
        __csiactor_subs "$cmdpath"
    end
end
complete -c csiactor -f -a '(__csiactor_complete)'
`)
}

// fishQuote quotes a command path for a fish case pattern; paths are
// lowercase words and spaces, so single quotes suffice.
func fishQuote(s string) string { return "'" + s + "'" }
