// Package tlsfiles loads the PEM files of a TLS server (a certificate, its
// key, and optionally a CA that client certificates must chain to) and
// serves them through a [tls.Config] that picks up new files without a
// restart.
//
// # Basics
//
// [Files.Load] reads the files once and says which file is wrong: missing,
// unreadable, holding no certificate, or a key that does not match its
// certificate. A [Reloader] serves the loaded files to every handshake
// and, run by its owner with [Reloader.Run], looks at the files' inode,
// size and modification time once per [CheckInterval]. A change is loaded
// once the files have stayed the same for one more check, so that a pair
// written one file after the other is not caught half-way. A new set that
// does not load keeps the old one in service; the next change is tried
// again.
//
// # Caveats
//
// Errors name files by path and say what is wrong with them; they never
// quote a file's content.
package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CheckInterval is how often [Reloader.Run] looks at the files.
const CheckInterval = time.Second

// MinVersion is the oldest TLS version a Reloader's server accepts.
const MinVersion = tls.VersionTLS12

// Files names the PEM files of a TLS server. Cert and Key are required;
// ClientCA, when set, makes the server require a client certificate
// signed by one of the CAs in it.
type Files struct {
	Cert, Key, ClientCA string
}

// Which file of a [Files] a [FileError] is about.
const (
	FileCert     = "cert"
	FileKey      = "key"
	FileClientCA = "client_ca"
)

// FileError is a file of a [Files] that does not load. Msg names the file
// by path and says what is wrong; it never holds the file's content.
type FileError struct {
	// File is FileCert, FileKey or FileClientCA.
	File string
	Msg  string
	Err  error
}

func (e *FileError) Error() string { return e.Msg }

func (e *FileError) Unwrap() error { return e.Err }

// Loaded is what a [Files] holds.
type Loaded struct {
	Cert tls.Certificate
	// ClientCAs is nil without a Files.ClientCA.
	ClientCAs *x509.CertPool
}

// Load reads the files; the error is a *FileError.
func (f Files) Load() (Loaded, error) {
	var out Loaded
	certPEM, err := readFile(FileCert, f.Cert)
	if err != nil {
		return out, err
	}
	if _, err := parseCerts(FileCert, f.Cert, certPEM); err != nil {
		return out, err
	}
	keyPEM, err := readFile(FileKey, f.Key)
	if err != nil {
		return out, err
	}
	if out.Cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		// The certificate parsed above, so what is left is the key.
		msg := fmt.Sprintf("%s holds no usable private key", f.Key)
		if strings.Contains(err.Error(), "does not match") {
			msg = fmt.Sprintf("%s does not match the certificate in %s", f.Key, f.Cert)
		}
		return Loaded{}, &FileError{File: FileKey, Msg: msg, Err: err}
	}
	if f.ClientCA != "" {
		if out.ClientCAs, err = LoadPool(FileClientCA, f.ClientCA); err != nil {
			return Loaded{}, err
		}
	}
	return out, nil
}

// LoadPool reads a PEM file of CA certificates into a pool; the error is a
// *FileError about file which (FileClientCA, or the caller's own name).
func LoadPool(which, path string) (*x509.CertPool, error) {
	b, err := readFile(which, path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(which, path, b)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// readFile reads path, with errors that name it and say why without the
// path twice.
func readFile(which, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return b, nil
	}
	msg := fmt.Sprintf("%s cannot be read", path)
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		msg = fmt.Sprintf("%s does not exist", path)
	case errors.As(err, &pe):
		msg = fmt.Sprintf("%s cannot be read: %s", path, pe.Err)
	}
	return nil, &FileError{File: which, Msg: msg, Err: err}
}

// parseCerts returns the certificates of the CERTIFICATE blocks of b: at
// least one, each valid.
func parseCerts(which, path string, b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, &FileError{File: which, Msg: fmt.Sprintf("%s holds a certificate that does not parse", path), Err: err}
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, &FileError{File: which, Msg: fmt.Sprintf("%s holds no PEM certificate", path)}
	}
	return certs, nil
}

// stamp is what says a file changed: its inode, size and modification
// time, or that it could not be looked at.
type stamp struct {
	ino   uint64
	size  int64
	mtime time.Time
	bad   bool
}

func stampOf(path string) stamp {
	if path == "" {
		return stamp{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{bad: true}
	}
	s := stamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

type stamps [3]stamp

func (f Files) stamps() stamps {
	return stamps{stampOf(f.Cert), stampOf(f.Key), stampOf(f.ClientCA)}
}

// Reloader serves a [Files] to TLS handshakes and loads it again when it
// changes (see the package comment). Its methods are safe for concurrent
// use.
type Reloader struct {
	files  Files
	report func(*x509.Certificate, error)

	mu      sync.Mutex
	current *tls.Config // guarded by mu; never changed once served
	loaded  stamps      // guarded by mu; the files as current was read, or last tried
	pending *stamps     // guarded by mu; a change seen at the last check
}

// NewReloader loads files (the error is a *FileError) and returns a
// Reloader serving them. report (if not nil) is called by Check after
// each attempt to load changed files: with the new certificate when it is
// served, with the *FileError that kept the old one in service otherwise.
func NewReloader(files Files, report func(*x509.Certificate, error)) (*Reloader, error) {
	r := &Reloader{files: files, report: report}
	r.loaded = files.stamps() // before reading: a change in between is seen later
	cfg, err := files.serverConfig()
	if err != nil {
		return nil, err
	}
	r.current = cfg
	return r, nil
}

func (f Files) serverConfig() (*tls.Config, error) {
	l, err := f.Load()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: MinVersion, Certificates: []tls.Certificate{l.Cert}}
	if l.ClientCAs != nil {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = l.ClientCAs
	}
	return cfg, nil
}

// ServerConfig returns the config of a TLS listener that serves the
// Reloader's current files to each handshake.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: MinVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.current, nil
		},
	}
}

// Check looks at the files once: a change seen at the previous Check and
// not since is loaded. Run calls it every CheckInterval.
func (r *Reloader) Check() {
	now := r.files.stamps()
	r.mu.Lock()
	switch {
	case now == r.loaded:
		r.pending = nil
		r.mu.Unlock()
		return
	case r.pending == nil || *r.pending != now:
		// Changed: wait until it holds still for one interval.
		r.pending = &now
		r.mu.Unlock()
		return
	}
	r.pending, r.loaded = nil, now
	r.mu.Unlock()

	cfg, err := r.files.serverConfig()
	var leaf *x509.Certificate
	if err == nil {
		leaf = cfg.Certificates[0].Leaf
		r.mu.Lock()
		r.current = cfg
		r.mu.Unlock()
	}
	if r.report != nil {
		r.report(leaf, err)
	}
}

// Run calls Check every CheckInterval until ctx ends.
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Check()
		}
	}
}
