package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/seal"
)

// SecretsConfig seals secrets at rest: with KeyFile set, every volume and
// snapshot secret the agent stores (in its state.db and, in cluster mode,
// in etcd) is sealed with AES-256-GCM, each value naming the key it used.
// Secrets stay in clear in memory, where the plugins need them. A nil
// *SecretsConfig (no secrets section) stores them as given; in cluster mode
// literal secrets are then refused.
type SecretsConfig struct {
	// KeyFile is the absolute path of the key that seals: a file of
	// exactly 32 random bytes, mode 0600 or stricter, the same file on
	// every host of a cluster. Required in a secrets section.
	KeyFile string `yaml:"key_file"`
	// PreviousKeyFiles are keys that only open, for a rotation: values
	// sealed with them are read, and `csiactor secrets reseal` seals them
	// again with KeyFile. Same rules as KeyFile.
	PreviousKeyFiles []string `yaml:"previous_key_files"`
}

func (c *SecretsConfig) withDefaults() *SecretsConfig {
	if c == nil {
		return nil
	}
	d := *c
	d.PreviousKeyFiles = append([]string(nil), c.PreviousKeyFiles...)
	return &d
}

// Validate checks c (nil is valid: nothing is sealed), reading each key
// file; the error is a *FieldError naming the key, like
// "secrets.previous_key_files[0]".
func (c *SecretsConfig) Validate() error {
	if c == nil {
		return nil
	}
	if c.KeyFile == "" {
		return fieldErr("secrets.key_file", "required in a secrets section: the absolute path of a file of 32 random bytes, mode 0600")
	}
	files := []struct{ key, path string }{{"secrets.key_file", c.KeyFile}}
	for i, p := range c.PreviousKeyFiles {
		files = append(files, struct{ key, path string }{fmt.Sprintf("secrets.previous_key_files[%d]", i), p})
	}
	for _, f := range files {
		if err := validateAbsPath(f.key, f.path); err != nil {
			return err
		}
		if _, err := seal.ReadKeyFile(f.path); err != nil {
			msg := err.Error()
			var pe *fs.PathError
			switch {
			case errors.Is(err, fs.ErrNotExist):
				msg = fmt.Sprintf("%s does not exist; make one with `head -c 32 /dev/urandom > %s && chmod 600 %s`", f.path, f.path, f.path)
			case errors.As(err, &pe):
				msg = fmt.Sprintf("%s cannot be read: %s", f.path, pe.Err)
			}
			return &FieldError{Field: f.key, Msg: msg, Err: err}
		}
	}
	return nil
}

// keyring reads the key files of c (nil for a nil c).
func (c *SecretsConfig) keyring() (*seal.Keyring, error) {
	if c == nil {
		return nil, nil
	}
	k, err := seal.Load(c.KeyFile, c.PreviousKeyFiles...)
	if err != nil {
		return nil, &kindError{kind: ErrInvalid, err: fmt.Errorf("secrets: %w", err)}
	}
	return k, nil
}

// validateSealing checks that c seals what cluster mode would otherwise
// put in etcd in clear: the Docker drivers' default secrets.
func (c Config) validateSealing() error {
	if c.Cluster == nil || c.Secrets != nil || c.Docker == nil {
		return nil
	}
	for i, d := range c.Docker.Drivers {
		if len(d.Defaults.Secrets) > 0 {
			return fieldErr(fmt.Sprintf("docker.drivers[%d].defaults.secrets", i), errLiteralSecrets)
		}
	}
	return nil
}

const errLiteralSecrets = "literal secrets are refused in cluster mode unless they are sealed: set secrets.key_file " +
	"(they would be stored in clear in etcd and state.db)"

// checkLiteralSecrets refuses secrets given in a request in cluster mode
// without a key to seal them with; field names them.
func (r *Runtime) checkLiteralSecrets(field string, secrets map[string]string) error {
	if len(secrets) == 0 || r.cfg.Cluster == nil || r.cfg.Secrets != nil {
		return nil
	}
	return fieldErr(field, errLiteralSecrets)
}

// ResealResult is what ResealSecrets did.
type ResealResult struct {
	// KeyID names the key everything is sealed with now.
	KeyID string `json:"key_id"`
	// Store is how many secret values were sealed again in this host's
	// state.db; Cluster how many in etcd (cluster mode).
	Store   int `json:"store"`
	Cluster int `json:"cluster"`
}

// ResealSecrets seals again with secrets.key_file every stored secret value
// sealed with a previous key (or stored in clear before a key was set):
// this host's state.db and, in cluster mode, the volume definitions in
// etcd (by compare-and-swap). Once it has run on every host, the previous
// keys can be dropped. Without secrets.key_file it fails with ErrConflict.
func (r *Runtime) ResealSecrets(ctx context.Context) (ResealResult, error) {
	if err := r.ready(); err != nil {
		return ResealResult{}, err
	}
	if !r.keys.Enabled() {
		return ResealResult{}, kinderr.Errorf(ErrConflict, "the agent has no secrets.key_file: there is no key to seal with")
	}
	res := ResealResult{KeyID: r.keys.CurrentID()}
	var err error
	if res.Store, err = r.store.Reseal(ctx); err != nil {
		return res, fmt.Errorf("reseal state.db: %w", err)
	}
	if r.cluster != nil {
		if res.Cluster, err = r.resealShared(ctx); err != nil {
			return res, err
		}
	}
	r.log.WithFields(map[string]any{"key_id": res.KeyID, "store": res.Store, "cluster": res.Cluster}).Info("secrets resealed")
	return res, nil
}
