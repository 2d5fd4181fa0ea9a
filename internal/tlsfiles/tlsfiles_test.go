package tlsfiles_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testpki"
	"github.com/csiactor/csiactor/internal/tlsfiles"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestFiles_Load_Errors(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	srv := ca.Server("server")
	other := ca.Server("other")
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing.pem")
	empty := write("empty.pem", nil)
	garbage := write("garbage.pem", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	keyOnly := write("keyonly.pem", srv.KeyPEM)
	for _, tc := range []struct {
		name     string
		files    tlsfiles.Files
		wantFile string
		wantMsg  string
	}{
		{"missing cert", tlsfiles.Files{Cert: missing, Key: srv.KeyFile}, tlsfiles.FileCert, missing + " does not exist"},
		{"cert is a directory", tlsfiles.Files{Cert: dir, Key: srv.KeyFile}, tlsfiles.FileCert, dir + " cannot be read: is a directory"},
		{"empty cert", tlsfiles.Files{Cert: empty, Key: srv.KeyFile}, tlsfiles.FileCert, empty + " holds no PEM certificate"},
		{"key as cert", tlsfiles.Files{Cert: keyOnly, Key: srv.KeyFile}, tlsfiles.FileCert, keyOnly + " holds no PEM certificate"},
		{"bad cert", tlsfiles.Files{Cert: garbage, Key: srv.KeyFile}, tlsfiles.FileCert, garbage + " holds a certificate that does not parse"},
		{"missing key", tlsfiles.Files{Cert: srv.CertFile, Key: missing}, tlsfiles.FileKey, missing + " does not exist"},
		{"cert as key", tlsfiles.Files{Cert: srv.CertFile, Key: srv.CertFile}, tlsfiles.FileKey, srv.CertFile + " holds no usable private key"},
		{"mismatched key", tlsfiles.Files{Cert: srv.CertFile, Key: other.KeyFile}, tlsfiles.FileKey, other.KeyFile + " does not match the certificate in " + srv.CertFile},
		{"missing CA", tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: missing}, tlsfiles.FileClientCA, missing + " does not exist"},
		{"CA without certificate", tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: keyOnly}, tlsfiles.FileClientCA, keyOnly + " holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.files.Load()
			var fe *tlsfiles.FileError
			if !errors.As(err, &fe) || fe.File != tc.wantFile || err.Error() != tc.wantMsg {
				t.Fatalf("Load: %v (%#v); want %s: %q", err, fe, tc.wantFile, tc.wantMsg)
			}
			for _, secret := range [][]byte{srv.KeyPEM, srv.CertPEM, other.KeyPEM} {
				if bytes.Contains([]byte(err.Error()), secret[30:60]) {
					t.Errorf("error shows a file's content: %v", err)
				}
			}
		})
	}
	l, err := tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: ca.File}.Load()
	if err != nil || l.ClientCAs == nil || !l.Cert.Leaf.Equal(srv.Cert) {
		t.Fatalf("Load of a good set: %+v, %v", l, err)
	}
}

// tlsServer serves TLS handshakes with cfg on a real TCP listener until
// the test ends.
func tlsServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return l.Addr().String()
}

// served returns the serial of the certificate the server at addr shows.
func served(t *testing.T, addr string, ca *testpki.CA) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestReloader_Check_RotatesKeepsOldOnBadPair(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	first, second, third := ca.Server("first"), ca.Server("second"), ca.Server("third")
	dir := t.TempDir()
	files := tlsfiles.Files{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	first.WriteTo(t, files.Cert, files.Key)

	var mu sync.Mutex
	var reports []error
	var leaves []*x509.Certificate
	r, err := tlsfiles.NewReloader(files, func(leaf *x509.Certificate, err error) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, err)
		leaves = append(leaves, leaf)
	})
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, r.ServerConfig())
	lastReport := func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) == 0 {
			return 0, nil
		}
		return len(reports), reports[len(reports)-1]
	}
	if got := served(t, addr, ca); got != first.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the first certificate", got)
	}

	// Unchanged files: nothing to report.
	r.Check()
	r.Check()
	if n, _ := lastReport(); n != 0 {
		t.Fatalf("%d reports without a change", n)
	}

	// A change is loaded once it held still for one check.
	second.WriteTo(t, files.Cert, files.Key)
	r.Check()
	if got := served(t, addr, ca); got != first.Cert.SerialNumber.String() {
		t.Errorf("a change is served before it held still")
	}
	r.Check()
	if n, err := lastReport(); n != 1 || err != nil {
		t.Fatalf("reports %d, last %v; want one nil", n, err)
	}
	if got := served(t, addr, ca); got != second.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the second certificate %s", got, second.Cert.SerialNumber)
	}
	mu.Lock()
	if !leaves[0].Equal(second.Cert) {
		t.Errorf("reported certificate %s, want the second", leaves[0].Subject)
	}
	mu.Unlock()

	// A mismatched pair keeps the second certificate.
	(&testpki.Pair{CertPEM: third.CertPEM, KeyPEM: first.KeyPEM}).WriteTo(t, files.Cert, files.Key)
	r.Check()
	r.Check()
	n, err := lastReport()
	var fe *tlsfiles.FileError
	if n != 2 || !errors.As(err, &fe) || fe.File != tlsfiles.FileKey || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("reports %d, last %v; want a key mismatch", n, err)
	}
	if got := served(t, addr, ca); got != second.Cert.SerialNumber.String() {
		t.Fatalf("serves %s after a bad pair, want the second certificate", got)
	}
	// Not reported again while nothing changes.
	r.Check()
	r.Check()
	if n, _ := lastReport(); n != 2 {
		t.Errorf("a bad pair reported %d times", n-1)
	}

	// Fixed: the third pair is served.
	third.WriteTo(t, files.Cert, files.Key)
	r.Check()
	r.Check()
	if n, err := lastReport(); n != 3 || err != nil {
		t.Fatalf("reports %d, last %v; want a third, nil", n, err)
	}
	if got := served(t, addr, ca); got != third.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the third certificate", got)
	}
}

func TestReloader_ServerConfig_ClientCAAndVersion(t *testing.T) {
	ca, otherCA := testpki.NewCA(t, "ca"), testpki.NewCA(t, "other")
	srv := ca.Server("server")
	r, err := tlsfiles.NewReloader(tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, r.ServerConfig())
	dial := func(cfg *tls.Config) error {
		cfg.RootCAs, cfg.ServerName = ca.Pool(), "127.0.0.1"
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3 reports a refused client certificate on the first
		// read; the server closes a good connection after the handshake.
		if _, err = c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if err := dial(&tls.Config{Certificates: []tls.Certificate{ca.Client("c").TLS(t)}}); err != nil {
		t.Errorf("a client certificate of the CA: %v", err)
	}
	if err := dial(&tls.Config{}); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("no client certificate: %v, want certificate required", err)
	}
	// Sent even though the server asks for its own CA's.
	foreign := otherCA.Client("c").TLS(t)
	force := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreign, nil }
	if err := dial(&tls.Config{GetClientCertificate: force}); err == nil || !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Errorf("a client certificate of another CA: %v, want unknown certificate authority", err)
	}
	if err := dial(&tls.Config{MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10,
		Certificates: []tls.Certificate{ca.Client("c").TLS(t)}}); err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("TLS 1.1: %v, want a protocol version alert", err)
	}
}

func TestReloader_Run_StopsWithContext(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	srv := ca.Server("server")
	r, err := tlsfiles.NewReloader(tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	cancel()
	<-done
}

// A new client CA file is picked up like a new pair: clients of the new CA
// get in, those of the old one no longer do.
func TestReloader_Check_RotatesClientCA(t *testing.T) {
	oldCA, newCA := testpki.NewCA(t, "old"), testpki.NewCA(t, "new")
	srv := oldCA.Server("server")
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	copyFile := func(from string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(caFile+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(caFile+".tmp", caFile); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(oldCA.File)
	r, err := tlsfiles.NewReloader(tlsfiles.Files{Cert: srv.CertFile, Key: srv.KeyFile, ClientCA: caFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, r.ServerConfig())
	accepted := func(ca *testpki.CA) bool {
		cert := ca.Client("c").TLS(t)
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: oldCA.Pool(), ServerName: "127.0.0.1",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }})
		if err != nil {
			return false
		}
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	if !accepted(oldCA) || accepted(newCA) {
		t.Fatalf("before the change: old CA accepted %v, new CA accepted %v", accepted(oldCA), accepted(newCA))
	}
	copyFile(newCA.File)
	r.Check()
	r.Check()
	if accepted(oldCA) || !accepted(newCA) {
		t.Fatalf("after the change: old CA accepted %v, new CA accepted %v", accepted(oldCA), accepted(newCA))
	}
}
