package api

import (
	"context"
	"net/http"

	"github.com/csiactor/csiactor/runtime"
)

// SecretsBackend is what a Backend adds for secrets at rest.
// *runtime.Runtime and *Client implement it; a Backend without it answers
// 404 on /v1/secrets/reseal.
type SecretsBackend interface {
	// ResealSecrets seals every stored secret again with the current key
	// (see runtime.Runtime.ResealSecrets).
	ResealSecrets(ctx context.Context) (runtime.ResealResult, error)
}

var (
	_ SecretsBackend = (*runtime.Runtime)(nil)
	_ SecretsBackend = (*Client)(nil)
)

func (s *server) resealSecrets(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	sb, ok := s.b.(SecretsBackend)
	if !ok {
		writeError(w, http.StatusNotFound, "this agent's backend keeps no secrets")
		return
	}
	res, err := sb.ResealSecrets(r.Context())
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// ResealSecrets seals every secret the agent stores again with its
// secrets.key_file (POST /v1/secrets/reseal): its state.db and, in cluster
// mode, the volume definitions in etcd.
func (c *Client) ResealSecrets(ctx context.Context) (runtime.ResealResult, error) {
	var out runtime.ResealResult
	return out, c.do(ctx, http.MethodPost, "/v1/secrets/reseal", nil, nil, &out)
}
