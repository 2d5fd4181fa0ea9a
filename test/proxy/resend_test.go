package proxy_test

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// A call that is under way on an allocation when it goes away is sent
// again to the allocation that serves now, and succeeds there: once when
// the old allocation's process stops (its call fails Unavailable after
// the newer allocation took over), once when the old allocation is
// deregistered (its client closed under the call). Each time the old
// plugin saw the call once and the new one answered it.
func TestProxy_CallResentAfterItsAllocationWentAway(t *testing.T) {
	for _, c := range []struct {
		name string
		gone func(e *env, old *fakeplugin.Plugin)
	}{
		{"old plugin stops", func(_ *env, old *fakeplugin.Plugin) { old.Stop() }},
		{"old allocation deregistered", func(e *env, _ *fakeplugin.Plugin) {
			if err := e.rt.DeregisterAllocation(context.Background(), "old"); err != nil {
				e.t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			old, _ := fakeplugin.Start(t, fakeplugin.Config{Name: "csi.fake", NodeID: "host-1", Controller: true, ListVolumes: true})
			e.register("old", runtime.AllocationSpec{Plugin: "fake", Type: runtime.TypeMonolith, Socket: old.SocketPath()})
			cc := dial(t, e.proxySocket("fake"))
			ctrl := csipb.NewControllerClient(cc)

			// The call hangs on the old plugin until it stops or its
			// caller (the agent's client) goes away.
			old.SetFault("ListVolumes", fakeplugin.Fault{Hang: true})
			type answer struct {
				resp *csipb.ListVolumesResponse
				err  error
			}
			done := make(chan answer, 1)
			callCtx, cancel := context.WithTimeout(ctx, waitLimit)
			defer cancel()
			go func() {
				resp, err := ctrl.ListVolumes(callCtx, &csipb.ListVolumesRequest{})
				done <- answer{resp, err}
			}()
			e.waitFor("the call on the old plugin", func() bool { return old.Calls("ListVolumes") == 1 })

			// A newer allocation takes over, then the old one goes.
			fresh, _ := fakeplugin.Start(t, fakeplugin.Config{Name: "csi.fake", NodeID: "host-1", Controller: true, ListVolumes: true})
			fresh.AddVolume(fakeplugin.Volume{ID: "on-the-new-one", CapacityBytes: 1 << 20})
			e.register("fresh", runtime.AllocationSpec{Plugin: "fake", Type: runtime.TypeMonolith, Socket: fresh.SocketPath()})
			e.waitAllocation("fresh", "the singleton", func(a runtime.Allocation) bool { return a.Singleton })
			c.gone(e, old)

			a := <-done
			if a.err != nil {
				t.Fatalf("the call failed: %v", a.err)
			}
			if len(a.resp.GetEntries()) != 1 || a.resp.GetEntries()[0].GetVolume().GetVolumeId() != "on-the-new-one" {
				t.Errorf("the answer %v is not the fresh plugin's", a.resp)
			}
			if n := fresh.Calls("ListVolumes"); n != 1 {
				t.Errorf("the fresh plugin saw %d ListVolumes, want 1", n)
			}
			if n := old.Calls("ListVolumes"); n != 1 {
				t.Errorf("the old plugin saw %d ListVolumes, want 1", n)
			}
		})
	}
}
