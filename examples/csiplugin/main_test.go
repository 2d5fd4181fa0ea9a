package csiplugin_test

import (
	"os"
	"testing"

	"github.com/csiactor/csiactor/internal/testbin"
)

// pluginProcessEnv makes the test binary run as the example plugin, with
// the flags it is given (see testbin.RunExamplePlugin): the tests that
// kill a plugin process start it so.
const pluginProcessEnv = "CSIPLUGIN_TEST_RUN_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(pluginProcessEnv) != "" {
		os.Exit(testbin.RunExamplePlugin(os.Args[1:]))
	}
	os.Exit(m.Run())
}
