package docker

import (
	"os"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestConfig_Loads(t *testing.T) {
	cfg, err := runtime.LoadConfigFile("csiactor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Docker
	if d == nil || len(d.Drivers) != 1 || d.Drivers[0].Plugin != cfg.Allocations[0].Plugin {
		t.Fatalf("docker section = %+v, want one driver of the allocation's plugin", d)
	}
	conf, err := os.ReadFile("containers.conf")
	if err != nil {
		t.Fatal(err)
	}
	want := d.Drivers[0].Name + ` = "` + d.PluginDir + "/" + d.Drivers[0].Name + `.sock"`
	if !strings.Contains(string(conf), want) {
		t.Errorf("containers.conf does not name the driver socket: want %q", want)
	}
}
