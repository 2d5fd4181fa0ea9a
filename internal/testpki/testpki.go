// Package testpki makes certificates for tests: a CA, and server and
// client certificates it signs, written as PEM files.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority of a test.
type CA struct {
	t    testing.TB
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate as a PEM file.
	File string
}

// Pair is a certificate and its key, in PEM and as files.
type Pair struct {
	Cert *x509.Certificate
	// CertPEM and KeyPEM are the files' content.
	CertPEM, KeyPEM []byte
	// CertFile and KeyFile are in the test's temp dir.
	CertFile, KeyFile string
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func template(cn string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

func writePEM(t testing.TB, path, typ string, der []byte) []byte {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// NewCA makes a CA named name, with its certificate in a file of the
// test's temp dir.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tpl := template(name)
	tpl.IsCA, tpl.BasicConstraintsValid = true, true
	tpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+"-ca.pem")
	writePEM(t, file, "CERTIFICATE", der)
	return &CA{t: t, Cert: cert, key: key, File: file}
}

// Pool returns a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server makes a server certificate for 127.0.0.1 (and localhost), named
// cn; it is also good as a client certificate.
func (ca *CA) Server(cn string) *Pair {
	ca.t.Helper()
	tpl := template(cn)
	tpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tpl.DNSNames = []string{"localhost"}
	tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return ca.sign(tpl)
}

// Client makes a client certificate named cn.
func (ca *CA) Client(cn string) *Pair {
	ca.t.Helper()
	tpl := template(cn)
	tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.sign(tpl)
}

func (ca *CA) sign(tpl *x509.Certificate) *Pair {
	t := ca.t
	t.Helper()
	tpl.KeyUsage = x509.KeyUsageDigitalSignature
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := &Pair{Cert: cert, CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	p.CertPEM = writePEM(t, p.CertFile, "CERTIFICATE", der)
	p.KeyPEM = writePEM(t, p.KeyFile, "PRIVATE KEY", keyDER)
	return p
}

// PEMLines returns the first two base64 lines of the certificate's and
// the key's PEM: what a test looks for to prove that no log, event or
// error shows the files' content.
func (p *Pair) PEMLines() []string {
	var out []string
	for _, b := range [][]byte{p.CertPEM, p.KeyPEM} {
		lines := strings.Split(string(b), "\n")
		out = append(out, lines[1], lines[2])
	}
	return out
}

// NotShown fails t if any of outs (logs, events, errors, output) holds a
// line of a PEM body of pairs, or one of the other secrets.
func NotShown(t testing.TB, pairs []*Pair, others []string, outs ...string) {
	t.Helper()
	secrets := append([]string(nil), others...)
	for _, p := range pairs {
		secrets = append(secrets, p.PEMLines()...)
	}
	for _, out := range outs {
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("output shows a secret (%.12s...):\n%s", s, out)
			}
		}
	}
}

// TLS returns the pair as a tls.Certificate.
func (p *Pair) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteTo writes the pair's PEM to certFile and keyFile (each through a
// rename, as a certificate manager does).
func (p *Pair) WriteTo(t testing.TB, certFile, keyFile string) {
	t.Helper()
	for _, f := range []struct {
		path string
		b    []byte
	}{{certFile, p.CertPEM}, {keyFile, p.KeyPEM}} {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, f.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			t.Fatal(err)
		}
	}
}
