package registry_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// A registry with one attached plugin allocation: register it, wait for it
// to be healthy, and get the client operations go to.
func ExampleHandle() {
	dir, _ := os.MkdirTemp("", "example-")
	defer os.RemoveAll(dir)
	fake := fakeplugin.New(fakeplugin.Config{Name: "csi.example.com", NodeID: "host-1"})
	_ = fake.Serve(filepath.Join(dir, "csi.sock"))
	defer fake.Stop()

	logger := logrus.New()
	logger.SetOutput(io.Discard)
	log := logrus.NewEntry(logger)
	store, err := persistence.Open(filepath.Join(dir, "state.db"), persistence.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	system := actorkit.NewSystem(log)
	defer system.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := registry.Start(ctx, system, registry.Config{Log: log, Store: store, DataDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer reg.Shutdown(ctx)

	if _, err := reg.Register(ctx, plugin.Spec{ID: "a1", Plugin: "example", Type: plugin.Node, Socket: fake.Endpoint()}); err != nil {
		fmt.Println(err)
		return
	}
	if err := reg.WaitHealthy(ctx, "example", plugin.Node); err != nil {
		fmt.Println(err)
		return
	}
	target, err := reg.Client(ctx, "example", plugin.Node)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(target.Alloc, target.Fingerprint.Provider, target.Fingerprint.NodeInfo.NodeID)
	// Output: a1 csi.example.com host-1
}
