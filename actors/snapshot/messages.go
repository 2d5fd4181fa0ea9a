package snapshot

import (
	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/claim"
)

// reply answers a request; err is set on failure.
type reply struct {
	snap Snapshot
	list []Snapshot
	err  error
}

// createRequest is sent to the snapshot actor by Manager.Create; sourceExt
// is the source volume's plugin ID, looked up by the caller. The reply
// comes when the snapshot is ready or has failed for good.
type createRequest struct {
	spec      Spec
	sourceExt string
	reply     chan<- reply
}

// deleteRequest is sent to the snapshot actor by Manager.Delete. The
// reply comes when the snapshot is deleted or the plugin refused.
type deleteRequest struct {
	id    string
	reply chan<- reply
}

// getRequest is sent to the snapshot actor by Manager.Get.
type getRequest struct {
	id    string
	reply chan<- reply
}

// listRequest is sent to the snapshot actor by Manager.List.
type listRequest struct {
	filter Filter
	reply  chan<- reply
}

// holdRequest is sent to the snapshot actor by Manager.Hold when a volume
// is about to be restored from snapshot id into a volume of plugin.
type holdRequest struct {
	id, plugin string
	reply      chan<- reply
}

// unholdRequest is sent to the snapshot actor when a restore from
// snapshot id has ended.
type unholdRequest struct{ id string }

// progress is sent to the snapshot actor by the goroutine of a create or
// delete between attempts: the last failure, or (snap set) the snapshot
// the plugin has cut but not made ready yet.
type progress struct {
	owner    *snapActor
	id       string
	snap     *csipb.Snapshot
	err      error
	attempts int
}

// opDone is sent to the snapshot actor by the goroutine of a create
// (snap is the plugin's answer) or a delete when it succeeded or failed
// for good.
type opDone struct {
	owner  *snapActor
	id     string
	delete bool
	res    claim.Result
	snap   *csipb.Snapshot
}
