// Package secretfile reads a volume's secrets from a file at the moment an
// RPC needs them (a volume's secrets_from), so that only the file's path is
// ever stored and replacing the file rotates the secrets.
//
// A reference is an absolute path, or $CREDENTIALS_DIRECTORY/NAME: the
// systemd credential NAME of the agent's unit (LoadCredential=,
// SetCredentialEncrypted=), that variable alone being expanded when the
// file is read. What it names is either
//
//   - a file holding a JSON or YAML map of strings ({"user": "u", ...} or
//     "user: u" lines), or
//   - a directory with one file per key: the file's name is the key, its
//     content the value, with one trailing newline removed ("\n" or
//     "\r\n", as `echo` or an editor leaves it); other trailing whitespace
//     is kept. Names starting with "." are skipped (a Kubernetes secret
//     volume keeps its ..data there); symbolic links are followed.
//
// Errors name the path and what is wrong with it, never a value.
package secretfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// CredentialsVar is the one environment variable a reference may start
// with: systemd's directory of the unit's credentials.
const CredentialsVar = "CREDENTIALS_DIRECTORY"

// ErrUnreadable is returned (wrapped) by Read when the secrets cannot be
// read: the file is missing, unreadable, empty or malformed, or
// $CREDENTIALS_DIRECTORY is unset.
var ErrUnreadable = errors.New("secrets file unreadable")

const credPrefix = "$" + CredentialsVar + "/"

// Check checks the form of reference ref (not the file): an absolute,
// clean path, or $CREDENTIALS_DIRECTORY/NAME with NAME a file name.
func Check(ref string) error {
	if name, ok := strings.CutPrefix(ref, credPrefix); ok {
		if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
			return fmt.Errorf("%q: want $%s/NAME with NAME a credential's name", ref, CredentialsVar)
		}
		return nil
	}
	if strings.Contains(ref, "$") {
		return fmt.Errorf("%q: only $%s/NAME may be expanded", ref, CredentialsVar)
	}
	if !filepath.IsAbs(ref) {
		return fmt.Errorf("%q is not an absolute path", ref)
	}
	if c := filepath.Clean(ref); c != ref {
		return fmt.Errorf("%q is not clean (cleaned, it is %q)", ref, c)
	}
	return nil
}

// Path is ref with $CREDENTIALS_DIRECTORY expanded.
func Path(ref string) (string, error) {
	name, ok := strings.CutPrefix(ref, credPrefix)
	if !ok {
		return ref, nil
	}
	dir := os.Getenv(CredentialsVar)
	if dir == "" {
		return "", fmt.Errorf("%w: %s: $%s is not set (the agent is not run by systemd with credentials)", ErrUnreadable, ref, CredentialsVar)
	}
	return filepath.Join(dir, name), nil
}

// Read reads the secrets ref refers to (see the package doc). The error
// wraps ErrUnreadable and names the path.
func Read(ref string) (map[string]string, error) {
	if err := Check(ref); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	p, err := Path(ref)
	if err != nil {
		return nil, err
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrUnreadable, p, fmt.Sprintf(format, a...))
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fail("%s", reason(err))
	}
	out := map[string]string{}
	if fi.IsDir() {
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, fail("%s", reason(err))
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			f := filepath.Join(p, e.Name())
			if st, err := os.Stat(f); err == nil && st.IsDir() {
				return nil, fail("%s is a directory; want one file per key", e.Name())
			}
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fail("key %s: %s", e.Name(), reason(err))
			}
			v := strings.TrimSuffix(string(b), "\n")
			if len(v) < len(b) {
				v = strings.TrimSuffix(v, "\r")
			}
			out[e.Name()] = v
		}
	} else {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fail("%s", reason(err))
		}
		// The parser's error may quote the content: it is not shown.
		if err := yaml.Unmarshal(b, &out); err != nil {
			return nil, fail("not a JSON or YAML map of strings")
		}
	}
	if len(out) == 0 {
		return nil, fail("holds no secrets")
	}
	for k := range out {
		if k == "" {
			return nil, fail("has an empty key")
		}
	}
	return out, nil
}

// reason is err without the path that os errors repeat.
func reason(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

type refKey struct{}

// WithRef returns ctx carrying ref, the reference the secrets of the RPC
// about to be sent were read from; an RPC forwarded to another host (a
// cluster's controller leader) sends the reference, not the values, and
// that host reads it.
func WithRef(ctx context.Context, ref string) context.Context {
	if ref == "" {
		return ctx
	}
	return context.WithValue(ctx, refKey{}, ref)
}

// RefFrom returns the reference WithRef put in ctx, or "".
func RefFrom(ctx context.Context) string {
	s, _ := ctx.Value(refKey{}).(string)
	return s
}
