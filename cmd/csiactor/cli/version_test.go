package cli_test

import (
	"encoding/json"
	goruntime "runtime"
	"testing"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
)

func TestVersion_Cases(t *testing.T) {
	r := runCLIContext(t.Context(), t, nil, []cli.Option{cli.WithVersion("v1.2.3")}, "version")
	r.want(t, 0, "")
	if want := "csiactor v1.2.3"; len(r.stdout) < len(want) || r.stdout[:len(want)] != want {
		t.Errorf("version = %q", r.stdout)
	}
	r = runCLIContext(t.Context(), t, nil, []cli.Option{cli.WithVersion("v1.2.3"), cli.WithRevision("0123456789ab")}, "version", "-json")
	r.want(t, 0, "")
	var v struct{ Version, Revision, Go string }
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version != "v1.2.3" || v.Revision != "0123456789ab" || v.Go != goruntime.Version() {
		t.Errorf("version -json = %+v, %v", v, err)
	}
	// Without WithVersion, the build info's version.
	r = runCLI(t, nil, "version")
	r.want(t, 0, "")
	r.contains(t, "stdout", "csiactor ", goruntime.Version())
	runCLI(t, nil, "version", "x").want(t, 2, "")
}
