package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/runtime"
)

func TestSecretsReseal_Cases(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "secrets", "reseal").want(t, 0, "Resealed 1 values in state.db and 0 in etcd with key "+apitest.FakeKeyID+"\n")

	r := runCLI(t, env, "secrets", "reseal", "-json")
	r.want(t, 0, "")
	var got runtime.ResealResult
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got != (runtime.ResealResult{KeyID: apitest.FakeKeyID, Store: 1}) {
		t.Errorf("reseal -json = %+v, %v", got, err)
	}

	r = runCLI(t, env, "secrets", "reseal", "extra")
	r.want(t, 2, "")
	r.contains(t, "stderr", "unexpected argument")

	b.FailWith("ResealSecrets", kinderr.Errorf(runtime.ErrConflict, "the agent has no secrets.key_file: there is no key to seal with"))
	r = runCLI(t, env, "secrets", "reseal")
	r.want(t, 1, "")
	r.contains(t, "stderr", "no secrets.key_file")

	r = runCLI(t, env, "secrets")
	r.want(t, 2, "")
	r.contains(t, "stderr", "missing command")
}
