package cli

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"

	"github.com/csiactor/csiactor/internal/tlsfiles"
)

// Environment variables of the client's TLS settings (Nomad's names with
// our prefix); the flags -ca-cert, -client-cert and -client-key take
// precedence. They apply to https:// addresses only.
const (
	CACertEnv     = "CSIACTOR_CACERT"
	ClientCertEnv = "CSIACTOR_CLIENT_CERT"
	ClientKeyEnv  = "CSIACTOR_CLIENT_KEY"
)

// tlsFlags are the client's TLS flags.
type tlsFlags struct {
	caCert, clientCert, clientKey string
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.caCert, "ca-cert", "", "PEM `file` of the CA that signed the agent's certificate, for an https:// address\n(default $"+CACertEnv+", else the system's CAs)")
	fs.StringVar(&f.clientCert, "client-cert", "", "PEM `file` of a client certificate, for an agent that asks for one\n(api.tls.client_ca_file; default $"+ClientCertEnv+")")
	fs.StringVar(&f.clientKey, "client-key", "", "PEM `file` of the -client-cert's key (default $"+ClientKeyEnv+")")
}

// setting is one TLS setting and where it came from, for errors.
type setting struct{ value, from string }

func (e *env) pick(flagValue, flagName, envName string) setting {
	if flagValue != "" {
		return setting{flagValue, "-" + flagName}
	}
	if v := e.getenv(envName); v != "" {
		return setting{v, "$" + envName}
	}
	return setting{}
}

// clientTLS returns the TLS config of an https:// addr from the flags,
// else the environment; nil when neither says anything. Flags with another
// address are a usage error; the environment is then ignored.
func (e *env) clientTLS(f *tlsFlags, addr string) (*tls.Config, error) {
	if !strings.HasPrefix(addr, "https://") {
		for _, s := range []struct{ v, name string }{{f.caCert, "ca-cert"}, {f.clientCert, "client-cert"}, {f.clientKey, "client-key"}} {
			if s.v != "" {
				return nil, usagef("-%s: the agent address %q is not https://", s.name, addr)
			}
		}
		return nil, nil
	}
	ca := e.pick(f.caCert, "ca-cert", CACertEnv)
	cert := e.pick(f.clientCert, "client-cert", ClientCertEnv)
	key := e.pick(f.clientKey, "client-key", ClientKeyEnv)
	switch {
	case cert.value != "" && key.value == "":
		return nil, usagef("%s needs -client-key (or $%s): the key of the client certificate", cert.from, ClientKeyEnv)
	case key.value != "" && cert.value == "":
		return nil, usagef("%s needs -client-cert (or $%s): the client certificate", key.from, ClientCertEnv)
	}
	cfg := &tls.Config{MinVersion: tlsfiles.MinVersion}
	if ca.value != "" {
		pool, err := tlsfiles.LoadPool(tlsfiles.FileClientCA, ca.value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ca.from, err)
		}
		cfg.RootCAs = pool
	}
	if cert.value != "" {
		l, err := tlsfiles.Files{Cert: cert.value, Key: key.value}.Load()
		if err != nil {
			from := cert.from
			if fe := (*tlsfiles.FileError)(nil); errors.As(err, &fe) && fe.File == tlsfiles.FileKey {
				from = key.from
			}
			return nil, fmt.Errorf("%s: %w", from, err)
		}
		cfg.Certificates = []tls.Certificate{l.Cert}
	}
	return cfg, nil
}

// explainTLS adds what to do to a failed TLS handshake with the agent: an
// unknown CA, or a refused (or missing) client certificate.
func (e *env) explainTLS(err error, f *tlsFlags) error {
	var verr *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &verr):
		return fmt.Errorf("%w: give the CA that signed the agent's certificate with -ca-cert FILE or $%s", err, CACertEnv)
	case errors.As(err, &op) && op.Op == "remote error":
		if cert := e.pick(f.clientCert, "client-cert", ClientCertEnv); cert.value != "" {
			return fmt.Errorf("%w: the agent refused the client certificate from %s", err, cert.from)
		}
		return fmt.Errorf("%w: the agent may want a client certificate: give -client-cert FILE and -client-key FILE, or $%s and $%s",
			err, ClientCertEnv, ClientKeyEnv)
	}
	return err
}
