package volume_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// onePlugin is the smallest Plugins: one monolith plugin behind one client.
// The runtime's implementation asks the registry instead.
type onePlugin struct {
	client csi.Client
	facts  claim.Facts
}

func (p onePlugin) Client(context.Context, string, claim.PluginType) (csi.Client, claim.Facts, error) {
	return p.client, p.facts, nil
}

func (onePlugin) WaitHealthy(context.Context, string, claim.PluginType) error { return nil }

func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "csivol-example-")
	defer os.RemoveAll(dir)

	// A plugin on a unix socket, a store, an actor system.
	plugin := fakeplugin.New(fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	if err := plugin.Serve(filepath.Join(dir, "csi.sock")); err != nil {
		fmt.Println(err)
		return
	}
	defer plugin.Stop()
	client, err := csi.Dial(ctx, "unix://"+filepath.Join(dir, "csi.sock"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store, err := persistence.Open(filepath.Join(dir, "state.db"), persistence.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	log := logrus.New()
	log.SetOutput(os.Stderr)
	log.SetLevel(logrus.WarnLevel)
	system := actorkit.NewSystem(logrus.NewEntry(log))
	defer system.Shutdown()

	m, err := volume.NewManager(system.Root, volume.Config{DataDir: dir, Logger: logrus.NewEntry(log)}, store,
		onePlugin{client: client, facts: claim.Facts{NodeID: fakeplugin.DefaultNodeID, ControllerRequired: true, StageUnstage: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Shutdown(ctx)

	writer := csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}
	if _, err := m.Register(ctx, volume.Spec{
		ID: "data", Plugin: "example", ExternalID: "vol-0001",
		Capabilities: []csi.VolumeCapability{writer},
		Secrets:      map[string]string{"token": "never printed"},
	}); err != nil {
		fmt.Println(err)
		return
	}
	c, err := m.Claim(ctx, volume.ClaimRequest{VolumeID: "data", Alloc: "web-1", Mode: claim.ModeWrite,
		AccessMode: writer.AccessMode, AttachmentMode: writer.AttachmentMode})
	if err != nil {
		fmt.Println(err)
		return
	}
	rel, _ := filepath.Rel(dir, c.TargetPath)
	fmt.Println(c.State, rel)

	_, err = m.Claim(ctx, volume.ClaimRequest{VolumeID: "data", Alloc: "web-2", Mode: claim.ModeWrite,
		AccessMode: writer.AccessMode, AttachmentMode: writer.AttachmentMode})
	fmt.Println(err)

	past, err := m.Release(ctx, "data", "web-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(past.State)
	// Output:
	// published volumes/example/per-alloc/web-1/data/rw-file-system-single-node-writer
	// access mode single-node-writer allows one claim and alloc "web-1" holds it
	// taken
}
