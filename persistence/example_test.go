package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/csiactor/csiactor/persistence"
)

func ExampleOpen() {
	dir, err := os.MkdirTemp("", "csiactor-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	st, err := persistence.Open(filepath.Join(dir, "state.db"), persistence.Config{})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	// Seq is assigned by the store and kept across re-registration.
	a, _ := st.PutAllocation(ctx, persistence.Allocation{ID: "node-b", Plugin: "hostpath", Type: "node"})
	b, _ := st.PutAllocation(ctx, persistence.Allocation{ID: "node-a", Plugin: "hostpath", Type: "node"})
	again, _ := st.PutAllocation(ctx, persistence.Allocation{ID: "node-b", Plugin: "hostpath", Type: "node", Healthy: true})
	fmt.Println(a.Seq, b.Seq, again.Seq)

	_ = st.PutVolume(ctx, persistence.Volume{ID: "idle", Plugin: "hostpath"})
	_ = st.PutVolume(ctx, persistence.Volume{ID: "busy", Plugin: "hostpath",
		Claims: []persistence.Claim{{Alloc: "web-1", Mode: "write", State: "published"}}})
	active, _ := st.ActiveVolumes(ctx)
	for _, v := range active {
		fmt.Println(v.ID, v.Claims[0].State)
	}

	// A second agent on the same data dir is refused.
	_, err = persistence.Open(filepath.Join(dir, "state.db"), persistence.Config{LockTimeout: 100 * time.Millisecond})
	fmt.Println(errors.Is(err, persistence.ErrInUse))
	// Output:
	// 1 2 1
	// busy published
	// true
}
