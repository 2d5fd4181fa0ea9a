package api_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/internal/testpki"
)

// A Client with WithTLSConfig talks to a TLS listener that requires its
// client certificate; the config is refused for an address that is not
// https://.
func TestClient_WithTLSConfig(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	srv := ca.Server("agent")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srv.TLS(t)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
	})
	b := apitest.NewBackend()
	apitest.ServeListener(t, tl, api.NewTCPHandler(b, "tok", api.Options{}))
	addr := "https://" + l.Addr().String()
	ctx := context.Background()

	c := newClient(t, addr, api.WithToken("tok"), api.WithTLSConfig(&tls.Config{
		RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client("operator").TLS(t)},
	}))
	if ps, err := c.Plugins(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("Plugins over mTLS: %v, %v", ps, err)
	}
	// Without the CA: the certificate is not trusted.
	c = newClient(t, addr, api.WithToken("tok"))
	var verr *tls.CertificateVerificationError
	if err := c.Health(ctx); !errors.As(err, &verr) {
		t.Errorf("Health without the CA: %v, want a certificate verification error", err)
	}
	// Without a client certificate: refused by the agent.
	c = newClient(t, addr, api.WithToken("tok"), api.WithTLSConfig(&tls.Config{RootCAs: ca.Pool()}))
	if err := c.Health(ctx); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("Health without a client certificate: %v", err)
	}
	// http:// to the TLS listener: told to use https://.
	c = newClient(t, "http://"+l.Addr().String(), api.WithToken("tok"))
	if err := c.Health(ctx); err == nil || !strings.Contains(err.Error(), "the agent serves TLS on this address: use an https:// address") {
		t.Errorf("Health over http:// to a TLS listener: %v, want the hint to use https://", err)
	}
	for _, a := range []string{"http://127.0.0.1:1", "unix:///run/api.sock"} {
		if _, err := api.NewClient(a, api.WithTLSConfig(&tls.Config{})); !errors.Is(err, api.ErrBadAddress) || !strings.Contains(err.Error(), "TLS settings need an https:// address") {
			t.Errorf("NewClient(%q, WithTLSConfig): %v, want ErrBadAddress", a, err)
		}
	}
}
