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
func (a APIConfig) tokensConfigured() bool { return a.TokenFile != "" || len(a.Tokens) > 0 }

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

// tlsKeys are the config keys of the files of a tlsfiles.Files.
var tlsKeys = map[string]string{tlsfiles.FileCert: "api.tls.cert_file", tlsfiles.FileKey: "api.tls.key_file", tlsfiles.FileClientCA: "api.tls.client_ca_file"}

// TLSFileError turns an error of loading the api.tls files (a
// *tlsfiles.FileError) into a *FieldError naming the file's key.
func TLSFileError(err error) error {
	var fe *tlsfiles.FileError
	if errors.As(err, &fe) {
		return &FieldError{Field: tlsKeys[fe.File], Msg: fe.Msg, Err: err}
	}
	return &FieldError{Field: "api.tls", Msg: "cannot be loaded", Err: err}
}

// validateTLS checks api.tls, reading its files, and api.insecure_tcp.
func (a APIConfig) validateTLS() error {
	if t := a.TLS; t != nil {
		for _, f := range []struct{ key, path string }{{tlsKeys[tlsfiles.FileCert], t.CertFile}, {tlsKeys[tlsfiles.FileKey], t.KeyFile}} {
			if f.path == "" {
				return fieldErr(f.key, "required in an api.tls section: the absolute path of a PEM file")
			}
		}
		for _, f := range []struct{ key, path string }{{tlsKeys[tlsfiles.FileCert], t.CertFile}, {tlsKeys[tlsfiles.FileKey], t.KeyFile}, {tlsKeys[tlsfiles.FileClientCA], t.ClientCAFile}} {
			if f.path != "" {
				if err := validateAbsPath(f.key, f.path); err != nil {
					return err
				}
			}
		}
		if _, err := t.Files().Load(); err != nil {
			return TLSFileError(err)
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

// Events of the TCP listener (the agent command records them).
const (
	// EventTLSReloaded: the api.tls files changed and the new ones are
	// served; Message names the certificate's subject and expiry.
	EventTLSReloaded = "tls-reloaded"
	// EventTLSReloadFailed: the api.tls files changed, and the new ones do
	// not load; the previous certificate is still served. Message names
	// the key and file and what is wrong (never the content).
	EventTLSReloadFailed = "tls-reload-failed"
	// EventInsecureTCP: the agent serves its API token in clear on an
	// address that is not a loopback one, because api.insecure_tcp says
	// so. Recorded at every start.
	EventInsecureTCP = "api-insecure-tcp"
)
