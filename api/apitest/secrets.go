package apitest

import (
	"context"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

var _ api.SecretsBackend = (*Backend)(nil)

// FakeKeyID is the key ID the fake's ResealSecrets answers with.
const FakeKeyID = "00112233aabbccdd"

// ResealSecrets implements api.SecretsBackend: it counts the secret values
// of the registered volumes as resealed in the store, none in a cluster.
func (b *Backend) ResealSecrets(context.Context) (runtime.ResealResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("ResealSecrets"); err != nil {
		return runtime.ResealResult{}, err
	}
	res := runtime.ResealResult{KeyID: FakeKeyID}
	for _, v := range b.volumes {
		res.Store += len(v.spec.Secrets)
	}
	return res, nil
}
