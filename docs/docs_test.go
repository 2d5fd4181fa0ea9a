// Package docs_test keeps the README and the pages of docs/ true to the
// repository: every directory is in their layout tables, every claim state
// the CLI prints is named, and every metric the code defines is listed.
package docs_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

// root is the repository, seen from this directory.
const root = ".."

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of doc under the heading line, up to the next
// heading of the same or a higher level outside code blocks.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	level := strings.Index(heading, " ")
	start := strings.Index(doc, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("no section %q", heading)
	}
	lines := strings.Split(doc[start+len(heading)+2:], "\n")
	code := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			code = !code
		}
		n := len(l) - len(strings.TrimLeft(l, "#"))
		if !code && n > 0 && n <= level && strings.HasPrefix(l[n:], " ") {
			return strings.Join(lines[:i], "\n")
		}
	}
	return strings.Join(lines, "\n")
}

// layoutRows returns the rows of the first table in text whose first cell
// is a `path/`: path (without the slash) → the rest of the row.
func layoutRows(text string) map[string]string {
	rows := map[string]string{}
	re := regexp.MustCompile("^\\| `([^`]+)/` \\|(.*)$")
	for _, l := range strings.Split(text, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			rows[m[1]] = m[2]
		}
	}
	return rows
}

// repoDirs returns every directory of the repository that holds a file
// directly, relative to root, except hidden ones (but .ci), build output
// and test data.
func repoDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") && name != ".ci" || name == "testdata" || rel == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if dir := path.Dir(rel); dir != "." && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(dirs)
	return dirs
}

// checkLayout checks that every directory of the repository is in rows:
// as a row of its own, or named (`name` or `name/`) in the row of its
// nearest listed parent; and that every row is a directory.
func checkLayout(t *testing.T, doc string, rows map[string]string) {
	t.Helper()
	if len(rows) == 0 {
		t.Fatalf("%s: no layout table", doc)
	}
	for _, d := range repoDirs(t) {
		if _, ok := rows[d]; ok {
			continue
		}
		parent := path.Dir(d)
		for ; parent != "."; parent = path.Dir(parent) {
			if _, ok := rows[parent]; ok {
				break
			}
		}
		row, ok := rows[parent]
		if !ok {
			t.Errorf("%s: directory %s/ is not in the layout table", doc, d)
			continue
		}
		first := strings.SplitN(strings.TrimPrefix(d, parent+"/"), "/", 2)[0]
		if !strings.Contains(row, "`"+first+"`") && !strings.Contains(row, "`"+first+"/`") {
			t.Errorf("%s: directory %s/ is not in the layout table, nor named (`%s/`) in the row of %s/", doc, d, first, parent)
		}
	}
	for r := range rows {
		if fi, err := os.Stat(filepath.Join(root, r)); err != nil || !fi.IsDir() {
			t.Errorf("%s: layout row %s/ is not a directory of the repository", doc, r)
		}
	}
}

func TestREADME_Layout_EveryDirectory(t *testing.T) {
	readme := readDoc(t, "README.md")
	checkLayout(t, "README.md", layoutRows(section(t, readme, "## Layout")))
}

func TestArchitecture_Layout_EveryDirectory(t *testing.T) {
	arch := readDoc(t, "docs/architecture.md")
	rows := layoutRows(section(t, arch, "## Repository layout"))
	checkLayout(t, "docs/architecture.md", rows)
	// This page lists every directory on a row of its own.
	for _, d := range repoDirs(t) {
		if _, ok := rows[d]; !ok {
			t.Errorf("docs/architecture.md: no row for %s/", d)
		}
	}
}

// Every state and condition a claim can show (and the CLI prints) is
// named in the README and in docs/architecture.md.
func TestDocs_ClaimStates_Named(t *testing.T) {
	states := []string{
		runtime.ClaimReserved, runtime.ClaimControllerPublished, runtime.ClaimStaged, runtime.ClaimPublished,
		runtime.ClaimTaken, runtime.ClaimNodeDetached, runtime.ClaimControllerDetached, runtime.ClaimReadyToFree, runtime.ClaimFreed,
		runtime.ClaimRemote, runtime.ClaimRepairing, runtime.ClaimDegraded,
	}
	for _, doc := range []string{"README.md", "docs/architecture.md"} {
		text := readDoc(t, doc)
		for _, s := range states {
			if !strings.Contains(text, "`"+s+"`") {
				t.Errorf("%s does not name the claim state `%s`", doc, s)
			}
		}
	}
}

var metricName = regexp.MustCompile(`"(csiactor_[a-z0-9_]+)"`)

// codeMetrics returns the csiactor_* names quoted in the repository's
// non-test Go files: the metrics the code defines.
func codeMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

// readmeMetrics returns the `csiactor_*` names the README's metrics
// paragraph lists.
func readmeMetrics(t *testing.T) []string {
	t.Helper()
	api := section(t, readDoc(t, "README.md"), "## HTTP API")
	i := strings.Index(api, "\nMetrics ")
	if i < 0 {
		t.Fatal("README: no Metrics paragraph in the HTTP API section")
	}
	var names []string
	for _, m := range regexp.MustCompile("`(csiactor_[a-z0-9_]+)`").FindAllStringSubmatch(api[i:], -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

// The README lists every metric the code defines, and nothing else. (The
// tests of package api also compare it with a real runtime's /metrics.)
func TestREADME_Metrics_MatchCode(t *testing.T) {
	code, readme := codeMetrics(t), readmeMetrics(t)
	if len(code) < 10 {
		t.Fatalf("found only %v in the code", code)
	}
	for _, m := range code {
		if !slices.Contains(readme, m) {
			t.Errorf("metric %s is defined in the code but not listed in the README's Metrics paragraph", m)
		}
	}
	for _, m := range readme {
		if !slices.Contains(code, m) {
			t.Errorf("README lists metric %s, which no code defines", m)
		}
	}
}
