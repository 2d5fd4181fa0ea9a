package runtime

import (
	"context"
	"fmt"
	"sync"

	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
)

// MaxBatchVolumes is the most entries one RegisterVolumes call (one POST
// /v1/volumes/batch) takes.
const MaxBatchVolumes = 1000

// batchCreates bounds the CreateVolume calls (and, in cluster mode, the
// RegisterVolume calls of volumes the cluster has) of one RegisterVolumes
// in flight at once.
const batchCreates = 4

// Statuses of a BatchResult.
const (
	// BatchRegistered: the entry's volume is registered (new, the same
	// definition again, or an update of a registered volume's).
	BatchRegistered = "registered"
	// BatchCreated: the entry's volume was created through the plugin's
	// controller (or had been, with the same definition) and registered.
	BatchCreated = "created"
	// BatchRefused: the entry changed nothing; Error says why.
	BatchRefused = "refused"
)

// EventVolumesRegistered is the one event of a RegisterVolumes call that
// registered new volumes on this host: how many, and the first IDs. Single
// registrations, updates and creates keep their own events.
const EventVolumesRegistered = volume.EventVolumesRegistered

// BatchResult is the outcome of one entry of RegisterVolumes.
type BatchResult struct {
	// ID is the entry's id.
	ID string `json:"id"`
	// Status is BatchRegistered, BatchCreated or BatchRefused.
	Status string `json:"status"`
	// Error says why a refused entry was refused (a bad field, named; a
	// conflict with a registered volume; the plugin's error); empty
	// otherwise.
	Error string `json:"error,omitempty"`
	// Err is Error as an error wrapping the runtime's sentinels (ErrInvalid,
	// ErrConflict, ErrNotFound, ErrPluginUnavailable, ...), for Go callers.
	Err error `json:"-"`
}

// batchEntry is one valid entry of RegisterVolumes on its way.
type batchEntry struct {
	i      int // index in the call's entries
	create bool
	spec   volume.Spec // a register's
}

// RegisterVolumes registers or creates many volumes at once, up to
// MaxBatchVolumes, and returns one result per entry in entries' order. An
// entry with ExternalID is the body of a register (RegisterVolume, with
// ID; CapacityBytes, Topology and ContentSource are a create's and refused
// here); an entry without is the body of a create (CreateVolume). A
// refused entry names its cause in its result and does not stop the
// others.
//
// The call itself fails with ErrInvalid, and does nothing, for an empty
// list, more than MaxBatchVolumes entries, or one ID given twice.
//
// The registrations of volumes new to this host are validated with their
// plugin as RegisterVolume does and written in one store commit, with one
// EventVolumesRegistered event; in cluster mode the definitions of volumes
// new to the cluster are written to etcd instead (not to this host's
// store), MaxTxnOps/2 (64) volumes with their plugin volumes' ID records
// per transaction, each creating its keys only if they are absent. Entries for
// registered volumes go through RegisterVolume (no-op or update), creates
// through CreateVolume, a few at a time.
func (r *Runtime) RegisterVolumes(ctx context.Context, entries []CreateVolumeSpec) ([]BatchResult, error) {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	if err := CheckBatch(ids); err != nil {
		return nil, err
	}
	if err := r.ready(); err != nil {
		return nil, err
	}
	res := make([]BatchResult, len(entries))
	var regs, creates []batchEntry
	for i, e := range entries {
		res[i].ID = e.ID
		be, err := r.batchEntry(i, e)
		if err != nil {
			res[i].Err = err
			continue
		}
		if be.create {
			creates = append(creates, be)
		} else {
			regs = append(regs, be)
		}
	}
	wait := startEach(creates, func(be batchEntry) {
		_, res[be.i].Err = r.CreateVolume(ctx, entries[be.i])
	})
	if r.cluster != nil {
		r.registerBatchShared(ctx, entries, regs, res)
	} else {
		r.registerBatchLocal(ctx, regs, res)
	}
	wait()
	for i := range res {
		switch {
		case res[i].Err != nil:
			res[i].Err = mapErr(res[i].Err)
			res[i].Status, res[i].Error = BatchRefused, res[i].Err.Error()
		case entries[i].ExternalID == "":
			res[i].Status = BatchCreated
		default:
			res[i].Status = BatchRegistered
		}
	}
	return res, nil
}

// CheckBatch refuses a bulk registration as a whole, before anything is
// done, given the IDs of its entries in order ("" for an entry without
// one, which is refused as an entry): empty, more than MaxBatchVolumes
// entries, or an ID given twice. The error is a *FieldError naming
// "volumes".
func CheckBatch(ids []string) error {
	switch {
	case len(ids) == 0:
		return fieldErr("volumes", "is empty; give at least one volume")
	case len(ids) > MaxBatchVolumes:
		return fieldErr("volumes", fmt.Sprintf("has %d entries, more than %d; send them in several batches", len(ids), MaxBatchVolumes))
	}
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		if id == "" {
			continue
		}
		if j, dup := seen[id]; dup {
			return fieldErr(fmt.Sprintf("volumes[%d].id", i), fmt.Sprintf("%q is given twice (also volumes[%d]); nothing was registered", id, j))
		}
		seen[id] = i
	}
	return nil
}

// batchEntry validates entry i of RegisterVolumes.
func (r *Runtime) batchEntry(i int, e CreateVolumeSpec) (batchEntry, error) {
	if e.ExternalID == "" {
		if err := e.Validate(); err != nil {
			return batchEntry{}, err
		}
		return batchEntry{i: i, create: true}, nil
	}
	switch {
	case e.CapacityBytes != 0:
		return batchEntry{}, fieldErr("capacity_bytes", "is for a create (an entry without external_id); a registered volume has its size")
	case len(e.Topology) > 0:
		return batchEntry{}, fieldErr("topology", "is for a create (an entry without external_id)")
	case e.ContentSource != nil:
		return batchEntry{}, fieldErr("content_source", "is for a create (an entry without external_id)")
	}
	if err := ValidateID("id", e.ID); err != nil {
		return batchEntry{}, err
	}
	if err := e.VolumeSpec.Validate(); err != nil {
		return batchEntry{}, err
	}
	if err := r.checkLiteralSecrets("secrets", e.Secrets); err != nil {
		return batchEntry{}, err
	}
	vs, err := volumeSpec(e.ID, e.VolumeSpec)
	if err != nil {
		return batchEntry{}, err
	}
	return batchEntry{i: i, spec: vs}, nil
}

// registerBatchLocal registers regs on this host: see
// volume.Manager.RegisterBatch.
func (r *Runtime) registerBatchLocal(ctx context.Context, regs []batchEntry, res []BatchResult) {
	if len(regs) == 0 {
		return
	}
	for k, err := range r.volumes.RegisterBatch(ctx, specsOf(regs)) {
		res[regs[k].i].Err = err
	}
}

// registerBatchShared is registerBatchLocal in cluster mode, where etcd
// holds the definitions: a volume the cluster has goes through
// RegisterVolume (a no-op, or an update by compare-and-swap); the others
// are validated by this host's plugin, then written to etcd alone
// (cluster.Session.PutVolumes). This host keeps no record of
// them until it is asked about one, as of any volume of the cluster.
func (r *Runtime) registerBatchShared(ctx context.Context, entries []CreateVolumeSpec, regs []batchEntry, res []BatchResult) {
	if len(regs) == 0 {
		return
	}
	ids := make([]string, len(regs))
	for k, be := range regs {
		ids[k] = be.spec.ID
	}
	defs, err := r.cluster.VolumeDefs(ctx, ids)
	if err != nil {
		for _, be := range regs {
			res[be.i].Err = err
		}
		return
	}
	var fresh, known []batchEntry
	for k, be := range regs {
		if defs[k] != nil {
			known = append(known, be)
		} else {
			fresh = append(fresh, be)
		}
	}
	defer startEach(known, func(be batchEntry) {
		_, res[be.i].Err = r.RegisterVolume(ctx, be.spec.ID, entries[be.i].VolumeSpec)
	})()
	if len(fresh) == 0 {
		return
	}
	specs := specsOf(fresh)
	errs := r.volumes.RegisterBatchWith(ctx, specs, func(accepted []int) []error {
		out := make([]error, len(accepted))
		vols := make([]cluster.NewVolume, 0, len(accepted))
		var at []int // indexes into accepted of vols
		for k, i := range accepted {
			spec := entries[fresh[i].i].VolumeSpec
			def, err := clusterVolume{ID: specs[i].ID, Spec: spec}.encode(r.keys)
			if err != nil {
				out[k] = err
				continue
			}
			vols = append(vols, cluster.NewVolume{ID: specs[i].ID, Plugin: spec.Plugin, ExternalID: spec.ExternalID, Def: def})
			at = append(at, k)
		}
		for n, err := range r.cluster.PutVolumes(ctx, vols) {
			out[at[n]] = err
		}
		return out
	})
	for k, err := range errs {
		res[fresh[k].i].Err = err
	}
}

// specsOf returns the volume specs of entries, in their order.
func specsOf(entries []batchEntry) []volume.Spec {
	specs := make([]volume.Spec, len(entries))
	for k, be := range entries {
		specs[k] = be.spec
	}
	return specs
}

// startEach calls fn with each of entries, batchCreates at a time, in the
// background; the function it returns waits until every call has
// returned.
func startEach(entries []batchEntry, fn func(batchEntry)) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sem := make(chan struct{}, batchCreates)
		var calls sync.WaitGroup
		for _, be := range entries {
			sem <- struct{}{}
			calls.Add(1)
			go func() {
				defer func() { <-sem; calls.Done() }()
				fn(be)
			}()
		}
		calls.Wait()
	}()
	return wg.Wait
}
