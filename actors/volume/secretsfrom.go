package volume

import (
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/secretfile"
	"github.com/csiactor/csiactor/persistence"
)

// ErrSecretsUnreadable is returned when a volume's secrets_from cannot be
// read (missing, unreadable or malformed): the RPC that needs the secrets
// is not sent. It matches ErrInvalid.
var ErrSecretsUnreadable = kinderr.New(ErrInvalid, "volume secrets unreadable")

// readSecrets returns the secrets of volume id: secrets, or, when ref is
// set, what secretfile reads from it now. The error names the volume and
// the path, never a value.
func readSecrets(id string, secrets map[string]string, ref string) (map[string]string, error) {
	if ref == "" {
		return secrets, nil
	}
	s, err := secretfile.Read(ref)
	if err != nil {
		return nil, kinderr.Errorf(ErrSecretsUnreadable, "volume %q: secrets_from.file: %w", id, err)
	}
	return s, nil
}

// secretsOf is readSecrets of the record v.
func secretsOf(v *persistence.Volume) (map[string]string, error) {
	return readSecrets(v.ID, v.Secrets, v.SecretsFrom)
}
