package acceptance

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/testbin"
)

// TestAgent_TokenOverTCP_AuthAndCLI: with api.token_file the TCP listener
// serves the API to bearers of the token only, while health and metrics
// stay open; the CLI passes the token from -token-file or $CSIACTOR_TOKEN
// and says how when it is missing or refused; the token never reaches the
// log or an error. A token file others can read is refused.
func TestAgent_TokenOverTCP_AuthAndCLI(t *testing.T) {
	h := newHost(t)
	const token = "acc-T0ken-9f2e"
	tokenFile := h.write("token", token+"\n", 0o644)
	config := h.write("csiactor.yaml", "data_dir: "+filepath.Join(h.base, "data")+"\n"+
		"api:\n  http_addr: 127.0.0.1:0\n  token_file: "+tokenFile+"\n"+
		"log:\n  level: debug\n  format: json\n", 0o600)

	r := h.runAgent("-config", config)
	if r.code != 1 || !strings.Contains(r.stderr, "chmod 600") || strings.Contains(r.stderr+r.stdout, token) {
		t.Errorf("agent with a 0644 token file: want exit 1 saying chmod 600; got %s", r)
	}
	if err := os.Chmod(tokenFile, 0o600); err != nil {
		t.Fatal(err)
	}

	a := h.startAgent("-config", config)
	if !strings.Contains(readFile(a.stdout), "the API (with the bearer token) on "+a.tcpAddr) {
		t.Errorf("stdout does not say the TCP listener serves the API:\n%s", readFile(a.stdout))
	}
	c := &http.Client{}
	defer c.CloseIdleConnections()
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/v1/health", "", 200},
		{"/metrics", "", 200},
		{"/v1/plugins", "", 401},
		{"/v1/plugins", "Bearer wrong", 401},
		{"/v1/plugins", "Basic " + token, 401},
		{"/v1/plugins", "Bearer " + token, 200},
		{"/v1/plugins", "bearer " + token, 200}, // the scheme is case-insensitive
		{"/v1/volumes", "Bearer " + token, 200},
	} {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		status, body := httpDo(t, c, "GET", a.tcpAddr+tc.path, hdr)
		if status != tc.want {
			t.Errorf("GET %s with %q: %d %s, want %d", tc.path, tc.auth, status, body, tc.want)
		}
		if status == 401 && !strings.Contains(body, `"error"`) {
			t.Errorf("401 body is not a JSON error: %s", body)
		}
	}

	tcp := []string{"CSIACTOR_ADDR=" + a.tcpAddr}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		want string // on stderr
	}{
		{"no token", tcp, []string{"volume", "list"}, 1, "give the agent's API token with -token-file FILE or $CSIACTOR_TOKEN"},
		{"wrong token in env", append(tcp, "CSIACTOR_TOKEN=nope-nope"), []string{"volume", "list"}, 1, "the agent refused the token from $CSIACTOR_TOKEN"},
		{"token in env", append(tcp, "CSIACTOR_TOKEN="+token), []string{"volume", "list"}, 0, ""},
		{"token file", tcp, []string{"plugin", "list", "-token-file", tokenFile}, 0, ""},
		{"token file beats env", append(tcp, "CSIACTOR_TOKEN=nope-nope"), []string{"status", "-token-file", tokenFile}, 0, ""},
		{"health needs no token", tcp, []string{"status"}, 1, "give the agent's API token"},
	} {
		r := h.cli(tc.env, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: csiactor %v: want exit %d and %q; got %s", tc.name, tc.args, tc.code, tc.want, r)
		}
		if strings.Contains(r.stderr, token) || strings.Contains(r.stderr, "nope-nope") {
			t.Errorf("%s: stderr shows a token: %s", tc.name, r.stderr)
		}
	}

	a.signal(syscall.SIGINT)
	if code := a.wait(); code != 0 {
		t.Errorf("agent exit code after SIGINT: %d\n%s", code, testbin.Tail(a.logs(), 10))
	}
	if strings.Contains(a.logs(), token) {
		t.Errorf("the agent's log shows the token")
	}
	if fileExists(strings.TrimPrefix(a.unixAddr, "unix://")) {
		t.Errorf("API socket left after shutdown")
	}
}
