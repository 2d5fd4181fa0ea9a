package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// helpTree walks the command tree through the CLI's own -h output (not
// through the code that generates the scripts): every visible command
// path, and each leaf's flags.
func helpTree(t *testing.T) map[string][]string {
	t.Helper()
	tree := map[string][]string{}
	cmdLine := regexp.MustCompile(`^  (\S+)\s{2,}`)
	flagLine := regexp.MustCompile(`^  (-\S+)`)
	var walk func(path []string)
	walk = func(path []string) {
		r := runCLI(t, nil, append(slices.Clone(path), "-h")...)
		if r.code != 0 {
			t.Fatalf("%v -h: exit %d: %s", path, r.code, r.stderr)
		}
		section := ""
		var subs, flags []string
		for _, line := range strings.Split(r.stdout, "\n") {
			switch line {
			case "Commands:", "Flags:":
				section = line
				continue
			}
			if section == "Commands:" {
				if m := cmdLine.FindStringSubmatch(line); m != nil {
					subs = append(subs, m[1])
				}
			}
			if section == "Flags:" {
				if m := flagLine.FindStringSubmatch(line); m != nil {
					flags = append(flags, m[1])
				}
			}
		}
		tree[strings.Join(path, " ")] = flags
		for _, s := range subs {
			walk(append(slices.Clone(path), s))
		}
	}
	walk(nil)
	return tree
}

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	r := runCLI(t, nil, "completion", shell)
	r.want(t, 0, "")
	return r.stdout
}

// Every script names every command and every flag of each leaf, on the
// line of its command path.
func TestCompletion_CoversTree(t *testing.T) {
	tree := helpTree(t)
	for _, must := range []string{"volume claim", "alloc logs", "completion bash", "agent"} {
		if _, ok := tree[must]; !ok {
			t.Fatalf("walking -h found no %q; found %v", must, tree)
		}
	}
	if _, ok := tree["example-plugin"]; ok {
		t.Error("the hidden example-plugin command is in the help")
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			script := completionScript(t, shell)
			if strings.Contains(script, "example-plugin") {
				t.Error("the script completes the hidden example-plugin command")
			}
			lines := strings.Split(script, "\n")
			for path, flags := range tree {
				words := strings.Fields(path)
				if len(words) > 0 {
					parent := strings.Join(words[:len(words)-1], " ")
					if !hasEntry(lines, shell, parent, words[len(words)-1]) {
						t.Errorf("no subcommand %q under %q", words[len(words)-1], parent)
					}
				}
				for _, f := range flags {
					if !hasEntry(lines, shell, path, f) {
						t.Errorf("no flag %s of %q", f, path)
					}
				}
			}
		})
	}
}

// hasEntry reports whether the script's table has word on the line (bash,
// zsh) or in the lines (fish) after the case of path.
func hasEntry(lines []string, shell, path, word string) bool {
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch shell {
		case "fish":
			if l == "case '"+path+"'" && i+1 < len(lines) && slices.Contains(strings.Fields(lines[i+1]), word) {
				return true
			}
		default:
			if head, rest, ok := strings.Cut(l, ") echo "); ok && head == `"`+path+`"` &&
				slices.Contains(strings.Fields(strings.Trim(strings.TrimSuffix(rest, " ;;"), `"`)), word) {
				return true
			}
		}
	}
	return false
}

// shell returns the path of a shell, failing when CI requires every shell
// (CSIACTOR_TEST_SHELLS=1, set by .ci/run, which installs them) and
// skipping otherwise.
func shell(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CSIACTOR_TEST_SHELLS") != "" {
			t.Fatalf("%s is not installed (CSIACTOR_TEST_SHELLS is set)", name)
		}
		t.Skipf("%s is not installed; .ci/run installs it", name)
	}
	return p
}

// The cases every shell must complete the same way: the words typed
// (the last one is being completed) and the candidates wanted.
var completionCases = []struct {
	line string
	want []string
}{
	{"csiactor vo", []string{"volume"}},
	{"csiactor volume cl", []string{"claim"}},
	{"csiactor completion ", []string{"bash", "fish", "zsh"}},
	{"csiactor volume claim -al", []string{"-alloc"}},
	{"csiactor volume claim -alloc web1 -access-", []string{"-access-mode"}},
	{"csiactor volume status data1 -j", []string{"-json"}},
	{"csiactor agent -config ", []string{"FILES"}},
	{"csiactor volume claim -mode ", []string{"read", "write"}},
	{"csiactor volume claim -alloc web1 -access-mode single-node-", []string{"single-node-multi-writer", "single-node-reader-only", "single-node-single-writer", "single-node-writer"}},
	{"csiactor alloc register -type m", []string{"monolith"}},
	{"csiactor agent -log-format ", []string{"json", "text"}},
}

func writeScript(t *testing.T, shell string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "csiactor."+shell)
	if err := os.WriteFile(p, []byte(completionScript(t, shell)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runShell(t *testing.T, sh string, args ...string) string {
	t.Helper()
	cmd := exec.Command(sh, args...)
	cmd.Dir = t.TempDir() // file completion sees no files here
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", sh, args, err, out)
	}
	return string(out)
}

func sortedFields(s string) []string {
	f := strings.Fields(s)
	slices.Sort(f)
	return f
}

func TestCompletion_Bash(t *testing.T) {
	sh := shell(t, "bash")
	script := writeScript(t, "bash")
	runShell(t, sh, "-n", script)
	for _, tc := range completionCases {
		t.Run(tc.line, func(t *testing.T) {
			// compgen -f stands in for the file names (the directory is
			// empty, so mark it).
			prog := `source "$1"; compgen() { if [[ $1 == -f ]]; then echo FILES; else builtin compgen "$@"; fi; }
COMP_WORDS=($2); [[ $2 == *" " ]] && COMP_WORDS+=(""); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_csiactor; printf '%s\n' "${COMPREPLY[@]}"`
			got := sortedFields(runShell(t, sh, "-c", prog, "bash", script, tc.line))
			if !slices.Equal(got, tc.want) {
				t.Errorf("completing %q: got %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

func TestCompletion_Zsh(t *testing.T) {
	sh := shell(t, "zsh")
	script := writeScript(t, "zsh")
	runShell(t, sh, "-n", script)
	for _, tc := range completionCases {
		t.Run(tc.line, func(t *testing.T) {
			// Stand-ins for the completion system's compdef, compadd (which
			// keeps the candidates that start with the word typed) and
			// _files, so that the script's own logic runs in a plain zsh.
			prog := `compdef() { :; }; _files() { print FILES; }
compadd() { shift; local w; for w in "$@"; do [[ $w == ${words[CURRENT]}* ]] && print -- $w; done; return 0; }
source "$1"; words=(${=2}); [[ $2 == *" " ]] && words+=(""); CURRENT=${#words}; _csiactor`
			got := sortedFields(runShell(t, sh, "-f", "-c", prog, "zsh", script, tc.line))
			if !slices.Equal(got, tc.want) {
				t.Errorf("completing %q: got %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

func TestCompletion_Fish(t *testing.T) {
	sh := shell(t, "fish")
	script := writeScript(t, "fish")
	runShell(t, sh, "--no-execute", script)
	for _, tc := range completionCases {
		t.Run(tc.line, func(t *testing.T) {
			// fish completes a command line itself with complete -C.
			prog := `function __fish_complete_path; echo FILES; end; source $argv[1]; complete -C $argv[2]`
			got := sortedFields(runShell(t, sh, "--no-config", "-c", prog, script, tc.line))
			if !slices.Equal(got, tc.want) {
				t.Errorf("completing %q: got %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}
