package cli_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/testpki"
	"github.com/csiactor/csiactor/runtime"
)

const tlsTestToken = "tls-test-token-5f1c9a"

// tlsAgent is a real agent (the runtime, in-process) serving its TCP
// listener with TLS.
type tlsAgent struct {
	t              *testing.T
	ca             *testpki.CA
	dir, dataDir   string
	tokenFile      string
	certFile       string
	keyFile        string
	tcp            string // https://127.0.0.1:port
	stdout, stderr *syncBuffer
	stop           func() int
	servedCA       *testpki.Pair
	clientCert     *testpki.Pair
}

// writeFile writes b to a file in dir (mode 0600) and returns its path.
func writeFile(t *testing.T, dir, name, b string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startTLSAgent starts a real agent with api.tls: the server certificate
// of ca for 127.0.0.1 copied to files the test may rotate, a token, the web
// UI, and, with mTLS, ca as api.tls.client_ca_file.
func startTLSAgent(t *testing.T, ca *testpki.CA, mTLS bool) *tlsAgent {
	t.Helper()
	a := &tlsAgent{t: t, ca: ca, dir: t.TempDir()}
	a.dataDir = filepath.Join(a.dir, "data")
	a.tokenFile = writeFile(t, a.dir, "token", tlsTestToken+"\n")
	a.certFile, a.keyFile = filepath.Join(a.dir, "cert.pem"), filepath.Join(a.dir, "key.pem")
	a.servedCA = ca.Server("agent-1")
	a.servedCA.WriteTo(t, a.certFile, a.keyFile)
	cfg := "data_dir: " + a.dataDir + "\nlog: {format: json, level: debug}\napi:\n  http_addr: 127.0.0.1:0\n  ui: true\n  token_file: " + a.tokenFile +
		"\n  tls:\n    cert_file: " + a.certFile + "\n    key_file: " + a.keyFile + "\n"
	if mTLS {
		cfg += "    client_ca_file: " + ca.File + "\n"
		a.clientCert = ca.Client("operator")
	}
	a.tcp, a.stdout, a.stderr, a.stop = startAgentWith(t, nil, "-config", writeFile(t, a.dir, "csiactor.yaml", cfg))
	if !strings.HasPrefix(a.tcp, "https://") {
		t.Fatalf("the agent announces %s, want https://", a.tcp)
	}
	return a
}

// clientConfig returns a TLS config that trusts the agent's CA and, with
// mTLS, shows the client certificate.
func (a *tlsAgent) clientConfig() *tls.Config {
	cfg := &tls.Config{RootCAs: a.ca.Pool()}
	if a.clientCert != nil {
		cfg.Certificates = []tls.Certificate{a.clientCert.TLS(a.t)}
	}
	return cfg
}

// get sends GET path over TLS with cfg and the token; it returns the
// answer's status and body, and the serial of the agent's certificate.
func (a *tlsAgent) get(cfg *tls.Config, path string) (status int, body, serial string, err error) {
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, a.tcp+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Authorization", "Bearer "+tlsTestToken)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.TLS.PeerCertificates[0].SerialNumber.String(), err
}

// events returns the agent's events of type typ, through its unix socket.
func (a *tlsAgent) events(typ string) []runtime.Event {
	a.t.Helper()
	c, err := api.NewClient("unix://" + filepath.Join(a.dataDir, "api.sock"))
	if err != nil {
		a.t.Fatal(err)
	}
	defer c.Close()
	return eventsOf(a.t, c, typ)
}

// eventsOf returns the events of type typ that b has.
func eventsOf(t *testing.T, b interface {
	Events(context.Context) ([]runtime.Event, error)
}, typ string) []runtime.Event {
	t.Helper()
	evs, err := b.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []runtime.Event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// noSecrets fails if the token, or a line of a PEM file's body, is in any
// of outs.
func noSecrets(t *testing.T, pairs []*testpki.Pair, outs ...string) {
	t.Helper()
	testpki.NotShown(t, pairs, []string{tlsTestToken}, outs...)
}

func TestAgent_TLS_MutualHandshakeUIAndCLI(t *testing.T) {
	ca, otherCA := testpki.NewCA(t, "ca"), testpki.NewCA(t, "other")
	a := startTLSAgent(t, ca, true)

	// A real handshake: the agent shows its certificate, takes ours.
	status, body, serial, err := a.get(a.clientConfig(), "/v1/plugins")
	if err != nil || status != 200 || body != "[]\n" || serial != a.servedCA.Cert.SerialNumber.String() {
		t.Fatalf("GET /v1/plugins over mTLS: %d %q serial %s, %v", status, body, serial, err)
	}

	// Refused: no client certificate, one of another CA, TLS 1.1, and an
	// unknown server CA.
	noCert := a.clientConfig()
	noCert.Certificates = nil
	foreign := otherCA.Client("intruder").TLS(t)
	forced := a.clientConfig()
	forced.Certificates = nil
	forced.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreign, nil }
	old := a.clientConfig()
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"no client certificate", noCert, "certificate required"},
		{"client certificate of another CA", forced, "unknown certificate authority"},
		{"TLS 1.1", old, "protocol version"},
		{"agent's CA unknown", &tls.Config{Certificates: a.clientConfig().Certificates}, "certificate signed by unknown authority"},
	} {
		if status, _, _, err := a.get(tc.cfg, "/v1/health"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %d, %v; want an error with %q", tc.name, status, err, tc.want)
		}
	}

	// The UI's session cookie is Secure under TLS.
	tr := &http.Transport{TLSClientConfig: a.clientConfig()}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(a.tcp+"/ui/login", "application/json", strings.NewReader(`{"token":"`+tlsTestToken+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cs := resp.Cookies(); resp.StatusCode != http.StatusNoContent || len(cs) != 1 || cs[0].Name != api.UICookie || !cs[0].Secure || !cs[0].HttpOnly {
		t.Errorf("UI login over TLS: %d, cookies %+v; want one Secure HttpOnly %s", resp.StatusCode, cs, api.UICookie)
	}
	resp, err = (&http.Client{Transport: tr}).Post(a.tcp+"/ui/logout", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cs := resp.Cookies(); len(cs) != 1 || cs[0].Name != api.UICookie || !cs[0].Secure || cs[0].MaxAge >= 0 {
		t.Errorf("UI logout over TLS: %d, cookies %+v; want the Secure %s cleared", resp.StatusCode, cs, api.UICookie)
	}

	// The CLI, with flags and with the environment.
	flags := []string{"-address", a.tcp, "-token-file", a.tokenFile, "-ca-cert", ca.File,
		"-client-cert", a.clientCert.CertFile, "-client-key", a.clientCert.KeyFile}
	runCLI(t, nil, append([]string{"plugin", "list"}, flags...)...).
		want(t, 0, "NAME  PROVIDER  VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n")
	env := map[string]string{cli.AddressEnv: a.tcp, cli.TokenEnv: tlsTestToken, cli.CACertEnv: ca.File,
		cli.ClientCertEnv: a.clientCert.CertFile, cli.ClientKeyEnv: a.clientCert.KeyFile}
	runCLI(t, env, "status").want(t, 0, "")
	// Flags win over the environment.
	badEnv := map[string]string{cli.AddressEnv: a.tcp, cli.TokenEnv: tlsTestToken, cli.CACertEnv: otherCA.File,
		cli.ClientCertEnv: a.clientCert.CertFile, cli.ClientKeyEnv: a.clientCert.KeyFile}
	runCLI(t, badEnv, "status", "-ca-cert", ca.File).want(t, 0, "")
	r := runCLI(t, badEnv, "status")
	r.want(t, 1, "")
	r.contains(t, "stderr", "certificate signed by unknown authority", "give the CA that signed the agent's certificate with -ca-cert FILE or $CSIACTOR_CACERT\n")

	r = runCLI(t, nil, "status", "-address", a.tcp, "-token-file", a.tokenFile, "-ca-cert", ca.File)
	r.want(t, 1, "")
	r.contains(t, "stderr", "certificate required", "the agent may want a client certificate: give -client-cert FILE and -client-key FILE")
	otherClient := otherCA.Client("intruder")
	r = runCLI(t, nil, "status", "-address", a.tcp, "-token-file", a.tokenFile, "-ca-cert", ca.File,
		"-client-cert", otherClient.CertFile, "-client-key", otherClient.KeyFile)
	r.want(t, 1, "")
	r.contains(t, "stderr", "the agent refused the client certificate from -client-cert\n")

	if code := a.stop(); code != 0 {
		t.Errorf("exit code %d\nstderr:\n%s", code, a.stderr.String())
	}
	noSecrets(t, []*testpki.Pair{a.servedCA, a.clientCert, otherClient}, a.stdout.String(), a.stderr.String(), r.stderr)
}

func TestClientTLS_FlagErrors(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	c := ca.Client("operator")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	const addr = "https://127.0.0.1:1"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"cert without key", nil, []string{"-client-cert", c.CertFile}, 2, "csiactor status: -client-cert needs -client-key (or $CSIACTOR_CLIENT_KEY): the key of the client certificate\n"},
		{"key without cert", nil, []string{"-client-key", c.KeyFile}, 2, "csiactor status: -client-key needs -client-cert (or $CSIACTOR_CLIENT_CERT)"},
		{"env cert without key", map[string]string{cli.ClientCertEnv: c.CertFile}, nil, 2, "csiactor status: $CSIACTOR_CLIENT_CERT needs -client-key"},
		{"missing CA", nil, []string{"-ca-cert", missing}, 1, "csiactor: -ca-cert: " + missing + " does not exist\n"},
		{"missing CA from env", map[string]string{cli.CACertEnv: missing}, nil, 1, "csiactor: $CSIACTOR_CACERT: " + missing + " does not exist\n"},
		{"CA file without a certificate", nil, []string{"-ca-cert", c.KeyFile}, 1, "csiactor: -ca-cert: " + c.KeyFile + " holds no PEM certificate\n"},
		{"missing client cert", nil, []string{"-client-cert", missing, "-client-key", c.KeyFile}, 1, "csiactor: -client-cert: " + missing + " does not exist\n"},
		{"mismatched key", nil, []string{"-client-cert", c.CertFile, "-client-key", ca.Client("x").KeyFile}, 1, "csiactor: -client-key: "},
		{"flags without https", nil, []string{"-address", "http://127.0.0.1:1", "-ca-cert", ca.File}, 2, `csiactor status: -ca-cert: the agent address "http://127.0.0.1:1" is not https://`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"status"}, tc.args...)
			if tc.env == nil || tc.env[cli.AddressEnv] == "" {
				env := map[string]string{cli.AddressEnv: addr}
				for k, v := range tc.env {
					env[k] = v
				}
				tc.env = env
			}
			r := runCLI(t, tc.env, args...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
			noSecrets(t, []*testpki.Pair{c}, r.stderr)
		})
	}
	// The environment's TLS settings do not apply to a unix socket.
	_, env := fakeAgent(t)
	env[cli.CACertEnv], env[cli.ClientCertEnv] = missing, c.CertFile
	runCLI(t, env, "status").want(t, 0, "")
}

// The agent serves a new certificate once its files change; a bad new
// pair keeps the old one with an error event and log line, and a fixed
// pair is served afterwards. No restart.
func TestAgent_TLS_RotationOnLiveAgent(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	a := startTLSAgent(t, ca, false)
	serving := func() string {
		_, _, serial, err := a.get(a.clientConfig(), "/v1/health")
		if err != nil {
			t.Fatalf("GET /v1/health: %v", err)
		}
		return serial
	}
	if got := serving(); got != a.servedCA.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the first certificate", got)
	}

	second := ca.Server("agent-2")
	second.WriteTo(t, a.certFile, a.keyFile)
	waitFor(t, "the second certificate served", func() bool { return serving() == second.Cert.SerialNumber.String() })
	waitFor(t, "a tls-reloaded event", func() bool { return len(a.events(runtime.EventTLSReloaded)) == 1 })
	if ev := a.events(runtime.EventTLSReloaded)[0]; !strings.Contains(ev.Message, `"CN=agent-2"`) || !strings.Contains(ev.Message, second.Cert.SerialNumber.String()) {
		t.Errorf("tls-reloaded event: %q", ev.Message)
	}

	// A key that does not match the certificate: the second stays.
	third := ca.Server("agent-3")
	(&testpki.Pair{CertPEM: third.CertPEM, KeyPEM: second.KeyPEM}).WriteTo(t, a.certFile, a.keyFile)
	waitFor(t, "a tls-reload-failed event", func() bool { return len(a.events(runtime.EventTLSReloadFailed)) == 1 })
	ev := a.events(runtime.EventTLSReloadFailed)[0]
	wantMsg := "api.tls.key_file: " + a.keyFile + " does not match the certificate in " + a.certFile + "; serving the previous certificate"
	if ev.Message != wantMsg {
		t.Errorf("tls-reload-failed event: %q, want %q", ev.Message, wantMsg)
	}
	if got := serving(); got != second.Cert.SerialNumber.String() {
		t.Errorf("after a bad pair serves %s, want the second certificate still", got)
	}
	if !strings.Contains(a.stderr.String(), `"level":"error","msg":"api.tls files changed but do not load; serving the previous certificate"`) {
		t.Errorf("no error log line for the bad pair:\n%s", a.stderr.String())
	}

	// Fixed.
	third.WriteTo(t, a.certFile, a.keyFile)
	waitFor(t, "the third certificate served", func() bool { return serving() == third.Cert.SerialNumber.String() })
	waitFor(t, "a second tls-reloaded event", func() bool { return len(a.events(runtime.EventTLSReloaded)) == 2 })

	all := ""
	for _, typ := range []string{runtime.EventTLSReloaded, runtime.EventTLSReloadFailed} {
		for _, e := range a.events(typ) {
			all += e.Message + "\n"
		}
	}
	if code := a.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	noSecrets(t, []*testpki.Pair{a.servedCA, second, third}, all, a.stdout.String(), a.stderr.String())
}

func TestAgent_TLS_ConfigErrors(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	srv, other := ca.Server("a"), ca.Server("b")
	dir := t.TempDir()
	token := writeFile(t, dir, "token", tlsTestToken+"\n")
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name, api string
		args      []string
		want      string
	}{
		{"token in clear off loopback", "  http_addr: 0.0.0.0:0\n  token_file: " + token + "\n", nil,
			`api.http_addr: "0.0.0.0:0" is not a loopback address, and without api.tls the API token would cross the network in clear: set api.tls (cert_file, key_file), or api.insecure_tcp: true to accept that`},
		{"-http-addr off loopback", "  token_file: " + token + "\n", []string{"-http-addr", "0.0.0.0:0"}, `config: api.http_addr: "0.0.0.0:0" is not a loopback address`},
		{"-dev off loopback", "", []string{"-dev", "-http-addr", "0.0.0.0:0"}, `config: api.http_addr: "0.0.0.0:0" is not a loopback address`},
		{"missing cert", "  tls: {cert_file: " + missing + ", key_file: " + srv.KeyFile + "}\n", nil, "api.tls.cert_file: " + missing + " does not exist\n"},
		{"mismatched key", "  tls: {cert_file: " + srv.CertFile + ", key_file: " + other.KeyFile + "}\n", nil,
			"api.tls.key_file: " + other.KeyFile + " does not match the certificate in " + srv.CertFile + "\n"},
		{"CA without a certificate", "  tls: {cert_file: " + srv.CertFile + ", key_file: " + srv.KeyFile + ", client_ca_file: " + srv.KeyFile + "}\n", nil,
			"api.tls.client_ca_file: " + srv.KeyFile + " holds no PEM certificate\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness()
			cfg := writeFile(t, t.TempDir(), "c.yaml", "data_dir: "+filepath.Join(t.TempDir(), "data")+"\napi:\n"+tc.api)
			r := runCLIContext(context.Background(), t, nil, []cli.Option{h.option()}, append([]string{"agent", "-config", cfg}, tc.args...)...)
			r.want(t, 1, "")
			r.contains(t, "stderr", tc.want)
			if h.created != 0 {
				t.Errorf("the runtime was built despite the config error")
			}
			noSecrets(t, []*testpki.Pair{srv, other}, r.stderr)
		})
	}
}

// api.insecure_tcp: true serves the token in clear off loopback, with a
// warning and an event at every start.
func TestAgent_InsecureTCP_WarnsAtStart(t *testing.T) {
	dir := t.TempDir()
	token := writeFile(t, dir, "token", tlsTestToken+"\n")
	cfg := writeFile(t, dir, "c.yaml", "data_dir: "+filepath.Join(dir, "data")+"\nlog: {format: json}\napi:\n  http_addr: 0.0.0.0:0\n  token_file: "+token+"\n  insecure_tcp: true\n")
	for start := 1; start <= 2; start++ {
		tcp, _, stderr, stop := startAgentWith(t, nil, "-config", cfg)
		// Listening on every interface, in clear.
		if !strings.HasPrefix(tcp, "http://[::]:") && !strings.HasPrefix(tcp, "http://0.0.0.0:") {
			t.Errorf("TCP address %s", tcp)
		}
		const warning = `"level":"warning","msg":"api.insecure_tcp: the API token crosses the network in clear on a non-loopback api.http_addr; set api.tls"`
		if !strings.Contains(stderr.String(), warning) {
			t.Errorf("start %d: no warning in the log:\n%s", start, stderr.String())
		}
		a := &tlsAgent{t: t, dataDir: filepath.Join(dir, "data")}
		if evs := a.events(runtime.EventInsecureTCP); len(evs) != 1 || !strings.Contains(evs[0].Message, "0.0.0.0:0") {
			t.Errorf("start %d: api-insecure-tcp events %+v", start, evs)
		}
		if code := stop(); code != 0 {
			t.Errorf("exit code %d", code)
		}
		noSecrets(t, nil, stderr.String())
	}
}
