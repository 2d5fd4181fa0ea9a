package runtime

import (
	"errors"
	"fmt"
	"net"

	"github.com/csiactor/csiactor/internal/tlsfiles"
)

// APITLSConfig holds the PEM files of the TCP listener's TLS; each is an
// absolute path, read (and checked) when the config is validated and again
// whenever it changes.
type APITLSConfig struct {
	// CertFile is the server certificate (and any intermediates after it).
	CertFile string `yaml:"cert_file"`
	// KeyFile is CertFile's private key.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile, when set, makes every client show a certificate signed
	// by one of the CAs in it (mutual TLS).
	ClientCAFile string `yaml:"client_ca_file"`
}

// Files returns the files of t for package tlsfiles.
func (t *APITLSConfig) Files() tlsfiles.Files {
	return tlsfiles.Files{Cert: t.CertFile, Key: t.KeyFile, ClientCA: t.ClientCAFile}
}

// tokensConfigured says whether a token opens the API on HTTPAddr.
func (a APIConfig) tokensConfigured() bool { return a.TokenFile != "" }

// InsecureTCPInUse says whether api.insecure_tcp is what lets the agent
// serve its API token in clear on an address that is not a loopback one:
// the agent then warns at every start.
func (a APIConfig) InsecureTCPInUse() bool {
	return a.InsecureTCP && a.TLS == nil && a.tokensConfigured() && !isLoopbackAddr(a.HTTPAddr)
}

// isLoopbackAddr says whether host:port addr only listens on the loopback
// interface: "localhost" or a loopback IP. An empty host listens on every
// interface; another name could resolve to anything.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validateTLS checks api.tls, reading its files, and api.insecure_tcp.
func (a APIConfig) validateTLS() error {
	if t := a.TLS; t != nil {
		keys := map[string]string{tlsfiles.FileCert: "api.tls.cert_file", tlsfiles.FileKey: "api.tls.key_file", tlsfiles.FileClientCA: "api.tls.client_ca_file"}
		for _, f := range []struct{ key, path string }{{keys[tlsfiles.FileCert], t.CertFile}, {keys[tlsfiles.FileKey], t.KeyFile}} {
			if f.path == "" {
				return fieldErr(f.key, "required in an api.tls section: the absolute path of a PEM file")
			}
		}
		for _, f := range []struct{ key, path string }{{keys[tlsfiles.FileCert], t.CertFile}, {keys[tlsfiles.FileKey], t.KeyFile}, {keys[tlsfiles.FileClientCA], t.ClientCAFile}} {
			if f.path != "" {
				if err := validateAbsPath(f.key, f.path); err != nil {
					return err
				}
			}
		}
		if _, err := t.Files().Load(); err != nil {
			var fe *tlsfiles.FileError
			if errors.As(err, &fe) {
				return &FieldError{Field: keys[fe.File], Msg: fe.Msg, Err: err}
			}
			return &FieldError{Field: "api.tls", Msg: "cannot be loaded", Err: err}
		}
		if a.InsecureTCP {
			return fieldErr("api.insecure_tcp", "true means nothing beside api.tls, which keeps the token off the network in clear; remove one")
		}
		return nil
	}
	if a.tokensConfigured() && !a.InsecureTCP && !isLoopbackAddr(a.HTTPAddr) {
		return fieldErr("api.http_addr", fmt.Sprintf("%q is not a loopback address, and without api.tls the API token would cross the network in clear: "+
			"set api.tls (cert_file, key_file), or api.insecure_tcp: true to accept that", a.HTTPAddr))
	}
	return nil
}
