package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/testpki"
)

func TestParseConfig_APITLS(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	srv, other := ca.Server("server"), ca.Server("other")
	dir := t.TempDir()
	keyOnly := filepath.Join(dir, "key-only.pem")
	if err := os.WriteFile(keyOnly, srv.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	tlsYAML := func(cert, key, ca string) string {
		s := "api:\n  http_addr: 0.0.0.0:7460\n  token_file: /etc/csiactor/token\n  tls:\n"
		if cert != "" {
			s += "    cert_file: " + cert + "\n"
		}
		if key != "" {
			s += "    key_file: " + key + "\n"
		}
		if ca != "" {
			s += "    client_ca_file: " + ca + "\n"
		}
		return s
	}

	got, err := ParseConfig([]byte(tlsYAML(srv.CertFile, srv.KeyFile, ca.File)))
	if err != nil {
		t.Fatalf("a good api.tls: %v", err)
	}
	want := APITLSConfig{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}
	if got.API.TLS == nil || *got.API.TLS != want || got.API.InsecureTCPInUse() {
		t.Fatalf("api.tls = %+v (insecure in use %v), want %+v", got.API.TLS, got.API.InsecureTCPInUse(), want)
	}

	for _, tc := range []struct {
		name, in, want string
	}{
		{"token off loopback in clear", "api:\n  http_addr: 0.0.0.0:7460\n  token_file: /t\n",
			`api.http_addr: "0.0.0.0:7460" is not a loopback address, and without api.tls the API token would cross the network in clear: set api.tls (cert_file, key_file), or api.insecure_tcp: true to accept that`},
		{"every interface", "api:\n  http_addr: \":7460\"\n  token_file: /t\n", `api.http_addr: ":7460" is not a loopback address`},
		{"a host name", "api:\n  http_addr: agent.example:7460\n  token_file: /t\n", `api.http_addr: "agent.example:7460" is not a loopback address`},
		{"an IPv6 address", "api:\n  http_addr: \"[2001:db8::1]:7460\"\n  token_file: /t\n", `api.http_addr: "[2001:db8::1]:7460" is not a loopback address`},
		{"scoped tokens off loopback in clear", "api:\n  http_addr: 0.0.0.0:7460\n  tokens:\n    - {name: monitor, file: /t, scope: read}\n", `api.http_addr: "0.0.0.0:7460" is not a loopback address`},
		{"insecure beside tls", tlsYAML(srv.CertFile, srv.KeyFile, "") + "  insecure_tcp: true\n", `api.insecure_tcp: true means nothing beside api.tls`},
		{"no cert", tlsYAML("", srv.KeyFile, ""), `line 4: api.tls.cert_file: required in an api.tls section: the absolute path of a PEM file`},
		{"no key", tlsYAML(srv.CertFile, "", ""), `api.tls.key_file: required in an api.tls section`},
		{"relative cert", tlsYAML("cert.pem", srv.KeyFile, ""), `api.tls.cert_file: "cert.pem" is not an absolute path`},
		{"relative CA", tlsYAML(srv.CertFile, srv.KeyFile, "ca.pem"), `api.tls.client_ca_file: "ca.pem" is not an absolute path`},
		{"missing cert", tlsYAML(missing, srv.KeyFile, ""), `api.tls.cert_file: ` + missing + ` does not exist`},
		{"unreadable cert", tlsYAML(dir, srv.KeyFile, ""), `api.tls.cert_file: ` + dir + ` cannot be read: is a directory`},
		{"missing key", tlsYAML(srv.CertFile, missing, ""), `api.tls.key_file: ` + missing + ` does not exist`},
		{"key of another cert", tlsYAML(srv.CertFile, other.KeyFile, ""), `api.tls.key_file: ` + other.KeyFile + ` does not match the certificate in ` + srv.CertFile},
		{"cert file without a certificate", tlsYAML(keyOnly, srv.KeyFile, ""), `api.tls.cert_file: ` + keyOnly + ` holds no PEM certificate`},
		{"CA file without a certificate", tlsYAML(srv.CertFile, srv.KeyFile, keyOnly), `api.tls.client_ca_file: ` + keyOnly + ` holds no PEM certificate`},
		{"missing CA", tlsYAML(srv.CertFile, srv.KeyFile, missing), `api.tls.client_ca_file: ` + missing + ` does not exist`},
		{"unknown tls key", "api:\n  tls:\n    cert: /c\n", `line 3: api.tls.cert: unknown key (known here: cert_file, client_ca_file, key_file)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfig:\n got %v\nwant %s", err, tc.want)
			}
			for _, pem := range [][]byte{srv.KeyPEM, srv.CertPEM, other.KeyPEM} {
				if strings.Contains(err.Error(), string(pem[40:80])) {
					t.Errorf("the error shows a file's content: %v", err)
				}
			}
		})
	}

	// What is not an error.
	for _, in := range []string{
		"api:\n  http_addr: 0.0.0.0:7460\n",                                         // no token: metrics and health only
		"api:\n  http_addr: 127.0.0.2:7460\n  token_file: /t\n",                     // loopback
		"api:\n  http_addr: \"[::1]:7460\"\n  token_file: /t\n",                     // loopback
		"api:\n  http_addr: localhost:7460\n  token_file: /t\n",                     // loopback
		"api:\n  http_addr: 0.0.0.0:7460\n  token_file: /t\n  insecure_tcp: true\n", // said on purpose
		tlsYAML(srv.CertFile, srv.KeyFile, ""),
	} {
		c, err := ParseConfig([]byte(in))
		if err != nil {
			t.Errorf("ParseConfig(%q): %v", in, err)
			continue
		}
		if wantInsecure := strings.Contains(in, "insecure_tcp"); c.API.InsecureTCPInUse() != wantInsecure {
			t.Errorf("ParseConfig(%q): InsecureTCPInUse = %v", in, !wantInsecure)
		}
	}
}
