package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/csiactor/csiactor/internal/kinderr"
	"maps"
	"sort"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/snapshot"
	"github.com/csiactor/csiactor/csi"
)

// Event types of snapshots; the event's Snapshot names it and Volume its
// source volume.
const (
	EventSnapshotCreating     = snapshot.EventSnapshotCreating
	EventSnapshotCreated      = snapshot.EventSnapshotCreated
	EventSnapshotCreateFailed = snapshot.EventSnapshotCreateFailed
	EventSnapshotDeleted      = snapshot.EventSnapshotDeleted
	EventSnapshotDeleteFailed = snapshot.EventSnapshotDeleteFailed
)

// SnapshotSpec is the body of a create-snapshot request (POST
// /v1/snapshots): a snapshot named ID of the registered volume
// SourceVolume, taken by Plugin's controller.
//
// Secrets are input only: String, GoString and MarshalJSON leave them out
// (MarshalJSON writes secret_count). [SnapshotSpec.RequestJSON] writes the
// full body for sending.
type SnapshotSpec struct {
	ID           string            `json:"id"`
	Plugin       string            `json:"plugin"`
	SourceVolume string            `json:"source_volume"`
	Parameters   map[string]string `json:"parameters,omitempty"`
	Secrets      map[string]string `json:"secrets,omitempty"`
}

// Validate checks s; the error is a *FieldError naming the bad field.
func (s SnapshotSpec) Validate() error {
	if err := ValidateID("id", s.ID); err != nil {
		return err
	}
	if err := ValidateID("plugin", s.Plugin); err != nil {
		return err
	}
	if err := ValidateID("source_volume", s.SourceVolume); err != nil {
		return err
	}
	if err := validateMap("parameters", s.Parameters, false); err != nil {
		return err
	}
	return validateMap("secrets", s.Secrets, true)
}

// String prints s without secrets.
func (s SnapshotSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "id=%q plugin=%q source_volume=%q", s.ID, s.Plugin, s.SourceVolume)
	if len(s.Parameters) > 0 {
		fmt.Fprintf(&b, " parameters=%v", s.Parameters)
	}
	if len(s.Secrets) > 0 {
		fmt.Fprintf(&b, " secrets=[%d redacted]", len(s.Secrets))
	}
	return "{" + b.String() + "}"
}

// GoString is String, so that %#v redacts too.
func (s SnapshotSpec) GoString() string { return "runtime.SnapshotSpec" + s.String() }

// snapshotSpecWire is SnapshotSpec without its redacting methods.
type snapshotSpecWire SnapshotSpec

// MarshalJSON writes s with secret_count in place of its secrets.
func (s SnapshotSpec) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID           string            `json:"id"`
		Plugin       string            `json:"plugin"`
		SourceVolume string            `json:"source_volume"`
		Parameters   map[string]string `json:"parameters,omitempty"`
		SecretCount  int               `json:"secret_count,omitempty"`
	}{s.ID, s.Plugin, s.SourceVolume, s.Parameters, len(s.Secrets)})
}

// RequestJSON returns the full JSON body of s, secrets included, for
// sending to the agent. Never log it.
func (s SnapshotSpec) RequestJSON() ([]byte, error) { return json.Marshal(snapshotSpecWire(s)) }

// Snapshot is a snapshot as the API shows it: one taken through this agent
// (Registered), or one only the plugin lists (ListSnapshots; then ID is
// empty and only the plugin's fields are set). It never holds secrets.
type Snapshot = snapshot.Snapshot

// SnapshotFilter selects snapshots in Snapshots; empty fields match all.
type SnapshotFilter struct {
	Plugin string
	// Volume is a source volume's ID here.
	Volume string
}

// Validate checks f; the error is a *FieldError naming the bad field.
func (f SnapshotFilter) Validate() error {
	if f.Plugin != "" {
		if err := ValidateID("plugin", f.Plugin); err != nil {
			return err
		}
	}
	if f.Volume != "" {
		return ValidateID("volume", f.Volume)
	}
	return nil
}

func (r *Runtime) startSnapshots(ctx context.Context) error {
	vb := r.cfg.Volumes.Retry
	var plugins claim.Plugins = r.plugins
	if r.ctrl != nil {
		// Cluster mode: a host without a controller of the plugin has
		// its snapshots taken by the plugin's controller leader.
		plugins = r.ctrl
	}
	var err error
	r.snaps, err = snapshot.NewManager(r.system.Root, snapshot.Config{
		Backoff:              csi.Backoff{Initial: vb.Initial, Max: vb.Max, Multiplier: vb.Multiplier, Jitter: vb.Jitter},
		Restarts:             r.restarts,
		RetryMetrics:         r.csiStats,
		MaxInFlightPerPlugin: r.cfg.Plugins.MaxInFlight,
		OnEvent:              r.snapshotEvent,
		Logger:               r.log.WithField("component", "snapshots"),
	}, r.store, volumeSources{r}, plugins)
	if err != nil {
		return fmt.Errorf("snapshot manager: %w", err)
	}
	if err := r.snaps.Start(ctx); err != nil {
		return fmt.Errorf("resume snapshots: %w", err)
	}
	return nil
}

func (r *Runtime) snapshotEvent(e snapshot.Event) {
	r.events.publish(Event{Time: e.Time, Type: e.Type, Plugin: e.Plugin, Volume: e.Volume, Snapshot: e.Snapshot, Message: e.Message})
}

// volumeSources gives the snapshot manager the volumes it takes snapshots
// of.
type volumeSources struct{ r *Runtime }

func (v volumeSources) Source(ctx context.Context, id string) (string, string, bool, error) {
	release, err := v.r.hold(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, err
	}
	defer release()
	vol, err := v.r.volumes.Get(ctx, id)
	if err != nil {
		if errors.Is(mapErr(err), ErrNotFound) {
			return "", "", false, nil
		}
		return "", "", false, err
	}
	return vol.Plugin, vol.ExternalID, true, nil
}

// snapshotHolder gives the volume manager the snapshots it restores from;
// the snapshot manager starts after the volume manager, and before any
// request is served.
type snapshotHolder struct{ r *Runtime }

func (h snapshotHolder) Hold(ctx context.Context, id, plugin string) (string, func(), error) {
	if h.r.snaps == nil {
		return "", nil, kinderr.Errorf(ErrShutdown, "content_source.snapshot: snapshots are not started yet")
	}
	return h.r.snaps.Hold(ctx, id, plugin)
}

// CreateSnapshot takes a snapshot of a registered volume through its
// plugin's controller (CreateSnapshot, named spec.ID, so a retry finds the
// same snapshot) and returns it once the plugin says it is ready to use.
// The snapshot is recorded before the first call, and a crashed agent
// finishes it when it starts again; a caller that gives up (ctx) leaves it
// running. The same spec again returns the snapshot; another spec under
// the same ID is ErrConflict.
//
// It fails with ErrNotFound for an unknown source volume, with ErrInvalid
// for a source volume of another plugin or a plugin whose controller has
// no CREATE_DELETE_SNAPSHOT capability, with ErrPluginUnavailable when no
// controller is healthy, and with the plugin's refusal, classified like
// every plugin error.
func (r *Runtime) CreateSnapshot(ctx context.Context, spec SnapshotSpec) (Snapshot, error) {
	if err := spec.Validate(); err != nil {
		return Snapshot{}, err
	}
	if err := r.checkLiteralSecrets("secrets", spec.Secrets); err != nil {
		return Snapshot{}, err
	}
	if err := r.ready(); err != nil {
		return Snapshot{}, err
	}
	s, err := r.snaps.Create(ctx, snapshot.Spec{
		ID: spec.ID, Plugin: spec.Plugin, SourceVolume: spec.SourceVolume,
		Parameters: maps.Clone(spec.Parameters), Secrets: maps.Clone(spec.Secrets),
	})
	if err != nil {
		return Snapshot{}, mapErr(err)
	}
	return s, nil
}

// DeleteSnapshot deletes snapshot id through its plugin's controller
// (DeleteSnapshot; one the plugin no longer has counts as deleted) and
// forgets it. It fails with ErrNotFound for an unknown snapshot, with
// ErrConflict while a volume is being restored from it or while it is
// being created.
func (r *Runtime) DeleteSnapshot(ctx context.Context, id string) error {
	if err := ValidateID("id", id); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	return mapErr(r.snaps.Delete(ctx, id))
}

// Snapshot returns snapshot id, or an error wrapping ErrNotFound.
func (r *Runtime) Snapshot(ctx context.Context, id string) (Snapshot, error) {
	if err := ValidateID("id", id); err != nil {
		return Snapshot{}, err
	}
	if err := r.ready(); err != nil {
		return Snapshot{}, err
	}
	s, err := r.snaps.Get(ctx, id)
	if err != nil {
		return Snapshot{}, mapErr(err)
	}
	return s, nil
}

// Snapshots lists the snapshots taken through this agent that f matches,
// and, for f.Plugin (or every plugin when it is empty) whose controller
// has LIST_SNAPSHOTS, the snapshots the plugin lists (ListSnapshots, all
// pages, of f.Volume's plugin volume when given): one the agent took is
// shown once, Registered; the others have no ID. A listing that fails is
// an error when f.Plugin names the plugin, and is logged and left out
// otherwise. Registered snapshots come first, by ID, then the others by
// plugin and external ID.
func (r *Runtime) Snapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if err := r.ready(); err != nil {
		return nil, err
	}
	ours, err := r.snaps.List(ctx, snapshot.Filter{Plugin: f.Plugin, Volume: f.Volume})
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Snapshot, 0, len(ours))
	known := map[[2]string]bool{} // plugin, external ID
	for _, s := range ours {
		out = append(out, s)
		if s.ExternalID != "" {
			known[[2]string{s.Plugin, s.ExternalID}] = true
		}
	}
	explicit := f.Plugin != ""
	var sourceExt string
	if f.Volume != "" {
		release, err := r.hold(ctx, f.Volume)
		if err != nil {
			return nil, err
		}
		defer release()
		v, err := r.volumes.Get(ctx, f.Volume)
		if err != nil {
			return nil, mapErr(err)
		}
		if f.Plugin != "" && v.Plugin != f.Plugin {
			return out, nil
		}
		sourceExt, f.Plugin = v.ExternalID, v.Plugin
	}
	plugins := []string{f.Plugin}
	if f.Plugin == "" {
		all, err := r.Plugins(ctx)
		if err != nil {
			return nil, err
		}
		plugins = plugins[:0]
		for _, p := range all {
			plugins = append(plugins, p.Name)
		}
	}
	var extra []Snapshot
	for _, name := range plugins {
		listed, err := r.listPluginSnapshots(ctx, name, sourceExt, explicit)
		if err != nil {
			if explicit {
				return nil, err
			}
			r.log.WithError(err).WithField("plugin", name).Warn("cannot list the plugin's snapshots; showing the agent's only")
			continue
		}
		for _, s := range listed {
			if !known[[2]string{s.Plugin, s.ExternalID}] {
				extra = append(extra, s)
			}
		}
	}
	sort.Slice(extra, func(i, j int) bool {
		if extra[i].Plugin != extra[j].Plugin {
			return extra[i].Plugin < extra[j].Plugin
		}
		return extra[i].ExternalID < extra[j].ExternalID
	})
	return append(out, extra...), nil
}

// listPluginSnapshots pages through plugin name's ListSnapshots, of the
// plugin volume sourceExt when given. A plugin without a controller with
// LIST_SNAPSHOTS lists nothing, unless it was asked for by name (explicit):
// then that is ErrInvalid.
func (r *Runtime) listPluginSnapshots(ctx context.Context, name, sourceExt string, explicit bool) ([]Snapshot, error) {
	t, err := r.registry.Client(ctx, name, plugin.Controller)
	if err != nil {
		if !explicit {
			return nil, nil // no controller here: nothing to list
		}
		return nil, mapErr(err)
	}
	if t.Fingerprint.Controller == nil || !t.Fingerprint.Controller.ListSnapshots {
		return nil, nil
	}
	var out []Snapshot
	token := ""
	for page := 0; ; page++ {
		if page >= 1000 {
			return nil, fmt.Errorf("plugin %s: ListSnapshots gave more than 1000 pages", name)
		}
		resp, err := t.Client.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{
			MaxEntries: MaxListEntries, StartingToken: token, SourceVolumeId: sourceExt,
		})
		if err != nil {
			return nil, mapErr(fmt.Errorf("plugin %s: %w", name, err))
		}
		for _, e := range resp.GetEntries() {
			s := e.GetSnapshot()
			sn := Snapshot{
				Plugin: name, ExternalID: s.GetSnapshotId(), SourceExternalID: s.GetSourceVolumeId(),
				SizeBytes: s.GetSizeBytes(), ReadyToUse: s.GetReadyToUse(),
				SourceVolume: r.volumes.RegisteredAs(name, s.GetSourceVolumeId()),
			}
			if ct := s.GetCreationTime(); ct != nil {
				sn.CreationTime = ct.AsTime()
			}
			out = append(out, sn)
		}
		if token = resp.GetNextToken(); token == "" {
			return out, nil
		}
	}
}
