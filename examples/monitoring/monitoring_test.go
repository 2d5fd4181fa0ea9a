// Package monitoring_test checks the monitoring kit in this directory: the
// Prometheus alerting rules (csiactor.rules.yml) and the Grafana dashboard
// (csiactor-dashboard.json) name only metrics that a running agent exports.
package monitoring_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const (
	rulesFile     = "csiactor.rules.yml"
	rulesTestFile = "csiactor.rules.test.yml"
	dashboardFile = "csiactor-dashboard.json"
)

// requiredAlerts are the conditions the kit must alert on.
var requiredAlerts = []string{
	"CsiactorPluginUnhealthy", "CsiactorPluginNoHealthyAllocation",
	"CsiactorClaimStuckInStep", "CsiactorClaimStuckInTeardown", "CsiactorClaimStalled", "CsiactorMountBroken",
	"CsiactorVolumeAlmostFull", "CsiactorVolumeInodesLow", "CsiactorVolumeConditionAbnormal",
	"CsiactorStoreCommitsSlow", "CsiactorPluginHungRestarted",
}

// metricRE finds csiactor metric names in PromQL.
var metricRE = regexp.MustCompile(`\bcsiactor_[a-z0-9_]+\b`)

type rulesDoc struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// kitExprs returns every PromQL expression of the rules and the dashboard,
// each with where it is, and checks the kit's shape on the way.
func kitExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules rulesDoc
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %s", rulesFile, err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := rulesFile + ": " + r.Alert
			alerts = append(alerts, r.Alert)
			switch {
			case r.Alert == "" || r.Expr == "":
				t.Errorf("%s: a rule of group %s has no alert name or expr", rulesFile, g.Name)
			case r.Labels["severity"] == "":
				t.Errorf("%s: no severity label", where)
			case r.Annotations["summary"] == "":
				t.Errorf("%s: no summary annotation", where)
			}
			exprs[where] = r.Expr
		}
	}
	for _, a := range requiredAlerts {
		if !slices.Contains(alerts, a) {
			t.Errorf("%s has no alert %s", rulesFile, a)
		}
	}

	b, err = os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %s", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("%s: no title or uid", dashboardFile)
	}
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("%s: panel %q target %d", dashboardFile, p.Title, i)] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			exprs[fmt.Sprintf("%s: variable %s", dashboardFile, v.Name)] = v.Definition
		}
	}
	if panels < 10 {
		t.Errorf("%s has %d panels", dashboardFile, panels)
	}
	return exprs
}

// TestMonitoringKit_MetricsExist runs a real agent (in-process, through
// the CLI's agent command, with its HTTP listener) with the example plugin
// attached, claims volumes until every kind of series the kit uses exists
// (a retried step included, and the usage and condition of a published
// volume), scrapes /metrics and checks that every metric the rules and the
// dashboard name is there.
func TestMonitoringKit_MetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an agent; skipped with -short")
	}
	exprs := kitExprs(t)
	dir, err := os.MkdirTemp("", "csimon-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	// The example plugin, attached: at most one volume controller
	// published at once, so that a second claim is retried.
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	plug, err := csiplugin.New(csiplugin.Config{
		StateDir: filepath.Join(dir, "plugin"), NodeID: "node-1", MountMode: csiplugin.MountModeSymlink,
		MaxAttached: 1, Logger: logrus.NewEntry(quiet),
	})
	if err != nil {
		t.Fatal(err)
	}
	pluginSock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", pluginSock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = plug.Serve(l)
	}()
	t.Cleanup(func() { plug.Stop(); <-served })

	apiSock := filepath.Join(dir, "api.sock")
	cfgPath := filepath.Join(dir, "csiactor.yaml")
	cfg := fmt.Sprintf(`data_dir: %s
api: {socket: %s, http_addr: "127.0.0.1:0"}
log: {level: error}
plugins: {heartbeat_interval: 500ms, probe_timeout: 500ms}
volumes:
  stats_interval: 100ms
  retry: {initial: 20ms, max: 200ms}
store: {no_sync: true}
allocations:
  - {id: ex, plugin: example, type: monolith, socket: %s}
`, filepath.Join(dir, "data"), apiSock, pluginSock)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() { exited <- cli.Run(ctx, []string{"agent", "-config", cfgPath}, &stdout, &stderr) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("agent exited with %d:\n%s", code, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
	}
	t.Cleanup(stop)
	addrRE := regexp.MustCompile(`metrics and health on (http://127\.0\.0\.1:\d+)`)
	var metricsURL string
	waitFor(t, "the agent to serve", func() bool {
		select {
		case code := <-exited:
			t.Fatalf("agent exited with %d:\n%s", code, stderr.String())
		default:
		}
		m := addrRE.FindStringSubmatch(stdout.String())
		if m != nil {
			metricsURL = m[1] + "/metrics"
		}
		return m != nil
	})

	c, err := api.NewClient("unix://" + apiSock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	waitFor(t, "the example plugin healthy", func() bool {
		p, err := c.Plugin(rctx, "example")
		return err == nil && p.NodesHealthy == 1 && p.ControllersHealthy == 1
	})
	spec := runtime.VolumeSpec{Plugin: "example", Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}
	for _, id := range []string{"a", "b"} {
		if _, err := c.CreateVolume(rctx, runtime.CreateVolumeSpec{ID: id, VolumeSpec: spec, CapacityBytes: 16 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	claim := runtime.ClaimRequest{Alloc: "web", Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system"}
	if _, err := c.Claim(rctx, "a", claim); err != nil {
		t.Fatal(err)
	}
	// b's ControllerPublishVolume is over the plugin's limit: retried.
	claimed := make(chan error, 1)
	go func() {
		_, err := c.Claim(rctx, "b", claim)
		claimed <- err
	}()
	waitFor(t, "a retried step", func() bool { return scrape(t, metricsURL)["csiactor_csi_retries_total"] })
	if _, err := c.Release(rctx, "a", "web"); err != nil {
		t.Fatal(err)
	}
	if err := <-claimed; err != nil {
		t.Fatalf("claim of b after a was released: %s", err)
	}
	var have map[string]bool
	waitFor(t, "b's usage and condition", func() bool {
		have = scrape(t, metricsURL)
		return have["csiactor_volume_stats_used_bytes"] && have["csiactor_volume_condition_abnormal"]
	})

	var missing []string
	for where, expr := range exprs {
		names := metricRE.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s names no csiactor metric: %s", where, expr)
		}
		for _, n := range names {
			if !have[n] {
				missing = append(missing, fmt.Sprintf("%s (%s)", n, where))
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not in the agent's /metrics: %s", m)
	}

	if _, err := c.Release(rctx, "b", "web"); err != nil {
		t.Fatal(err)
	}
	stop()
}

// TestMonitoringKit_Promtool checks the rules and runs their unit tests
// with promtool when it is installed (.ci/run installs it).
func TestMonitoringKit_Promtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (.ci/run installs it from Debian's prometheus package)")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %s\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// scrape returns the names of the samples at url (a /metrics page in the
// text format): histogram series with their _bucket, _sum and _count.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %s", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape: %s", err)
	}
	return names
}

// waitFor polls cond until it holds, failing after 60 s. It waits for
// the agent's progress; it measures nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
