package csiplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ExampleRun serves the plugin on a socket, asks who it is, and stops it by
// cancelling the context.
func ExampleRun() {
	dir, err := os.MkdirTemp("", "csiplugin-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "csi.sock")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- csiplugin.Run(ctx, csiplugin.Config{
			Endpoint: "unix://" + sock,
			StateDir: filepath.Join(dir, "state"),
			Logger:   quietLogger(),
		})
	}()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	info, err := csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		panic(err)
	}
	fmt.Println(info.GetName())
	conn.Close()

	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// example.csi.csiactor.dev
	// stopped: <nil>
}
