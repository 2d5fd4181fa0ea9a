package cli_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/examples/csiplugin"
)

// The hidden example-plugin command serves the example plugin on
// $CSI_ENDPOINT until interrupted.
func TestExamplePlugin_ServesUntilInterrupted(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "csi.sock")
	env := map[string]string{"CSI_ENDPOINT": "unix://" + socket}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, stderr, done := startCLI(ctx, t, env, nil, "example-plugin", "-state-dir", filepath.Join(dir, "state"), "-mount-mode", "symlink", "-node-id", "n1")
	waitFor(t, "the plugin socket", func() bool {
		select {
		case code := <-done:
			t.Fatalf("example-plugin exited with %d: %s", code, stderr.String())
		default:
		}
		// The socket file appears at bind, a moment before listen:
		// wait until it accepts a connection.
		c, err := net.Dial("unix", socket)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	info, err := csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || info.GetName() != csiplugin.DefaultName {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
	ni, err := csipb.NewNodeClient(conn).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "n1" {
		t.Errorf("NodeGetInfo = %v, %v", ni, err)
	}
	conn.Close()
	cancel()
	if code := exitCode(t, done); code != 0 {
		t.Errorf("exit code %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("plugin socket left behind: %v", err)
	}
}

func TestExamplePlugin_Usage(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, nil, "example-plugin", "-state-dir", dir)
	r.want(t, 2, "")
	r.contains(t, "stderr", "give -endpoint or set CSI_ENDPOINT")
	r = runCLI(t, nil, "example-plugin", "-endpoint", "unix://"+dir+"/csi.sock")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-state-dir is required")
	r = runCLI(t, nil, "example-plugin", "-endpoint", "tcp://x", "-state-dir", dir)
	r.want(t, 1, "")
	r.contains(t, "stderr", "only unix sockets are supported")
}
