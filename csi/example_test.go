package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func ExampleDial() {
	dir, err := os.MkdirTemp("", "csi-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "csi.sock")
	plugin := fakeplugin.New(fakeplugin.Config{Name: "csi.example.com", VendorVersion: "1.2.3"})
	if err := plugin.Serve(socket); err != nil {
		panic(err)
	}
	defer plugin.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := csi.Dial(ctx, "unix://"+socket, csi.WithPluginName("example"))
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()
	info, err := c.PluginInfo(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	ready, err := c.Probe(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.Name, info.VendorVersion, ready)
	// Output: csi.example.com 1.2.3 true
}

func ExampleRetryCall() {
	dir, err := os.MkdirTemp("", "csi-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	plugin := fakeplugin.New(fakeplugin.Config{})
	if err := plugin.Serve(filepath.Join(dir, "csi.sock")); err != nil {
		panic(err)
	}
	defer plugin.Stop()
	// The plugin is busy twice, then works.
	plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Aborted, Times: 2})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := csi.Dial(ctx, plugin.Endpoint())
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()

	req := &csipb.NodePublishVolumeRequest{
		VolumeId:         "vol-1",
		TargetPath:       filepath.Join(dir, "target"),
		VolumeCapability: csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}.ToCSI(),
	}
	backoff := csi.Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond}
	err = csi.RetryCall(ctx, backoff, csi.PublishKind, "NodePublishVolume", func(ctx context.Context) error {
		return c.NodePublishVolume(ctx, req)
	})
	fmt.Println(err, plugin.Calls("NodePublishVolume"), plugin.Published()["vol-1"] != nil)
	// Output: <nil> 3 true
}

func ExampleClassify() {
	gone := fmt.Errorf("NodeUnpublishVolume: %w", status.Error(codes.NotFound, "no such volume"))
	fmt.Println(csi.Classify(csi.UnpublishKind, gone))
	fmt.Println(csi.Classify(csi.PublishKind, status.Error(codes.Unavailable, "plugin restarting")))
	fmt.Println(csi.Classify(csi.UnpublishKind, status.Error(codes.FailedPrecondition, "still in use")))
	// Output:
	// success
	// uncertain
	// final
}
