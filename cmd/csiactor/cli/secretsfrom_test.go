package cli_test

import (
	"testing"
)

func TestVolumeRegister_SecretsFrom(t *testing.T) {
	b, env := populated(t)
	base := []string{"volume", "register", "-plugin", "hostpath", "-external-id", "ext-7", "-capability", "single-node-writer"}
	runCLI(t, env, append(base, "-secrets-from", "/etc/csiactor/vol7.yaml", "vol7")...).
		want(t, 0, "Registered volume vol7 (plugin hostpath, external ID ext-7)\n")
	got, ok := b.ReceivedVolumeSpec("vol7")
	if !ok || got.SecretsFrom == nil || got.SecretsFrom.File != "/etc/csiactor/vol7.yaml" || len(got.Secrets) != 0 {
		t.Fatalf("backend received %v (secrets_from %+v)", got, got.SecretsFrom)
	}
	runCLI(t, env, "volume", "status", "vol7").contains(t, "stdout", "Secrets from   /etc/csiactor/vol7.yaml\n")
	runCLI(t, env, append(base, "-secrets-from", "/etc/csiactor/vol6.yaml", "-secret", "k=v", "vol6")...).
		contains(t, "stderr", "secrets_from: cannot be combined with secrets")
	runCLI(t, env, append(base, "-secrets-from", "vol6.yaml", "vol6")...).
		contains(t, "stderr", `secrets_from.file: "vol6.yaml" is not an absolute path`)
	if _, ok := b.ReceivedVolumeSpec("vol6"); ok {
		t.Error("a refused volume reached the backend")
	}
}
