package registry

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/persistence"
)

// leftoverKillTimeout bounds the wait for a killed leftover process to go.
const leftoverKillTimeout = 10 * time.Second

// reconcile makes the store agree with the config file's allocations (see
// Config.ConfigAllocations) before the registry restores anything, so no
// actor or process is ever started for a spec the config no longer has.
// It runs in Start, before the registry actor exists: nothing else uses the
// store's allocations meanwhile. cfg is valid.
func reconcile(ctx context.Context, cfg Config) error {
	recs, err := cfg.Store.Allocations(ctx)
	if err != nil {
		return fmt.Errorf("%w: read allocations: %w", ErrStore, err)
	}
	want := map[string]plugin.Spec{}
	owner := map[string]string{} // socket → config allocation ID
	for _, s := range cfg.ConfigAllocations {
		s, _ = s.WithSocket(cfg.DataDir) // validated
		want[s.ID] = s
		owner[s.Socket] = s.ID
	}
	stored := map[string]persistence.Allocation{}
	for _, rec := range recs {
		if _, listed := want[rec.ID]; listed {
			stored[rec.ID] = rec
			continue
		}
		var why string
		switch id, taken := owner[storedSpec(rec, cfg.DataDir).Socket]; {
		case sourceOf(rec.Source) == SourceConfig:
			why = "it is no longer in the config file"
		case taken:
			why = fmt.Sprintf("config allocation %q uses its socket", id)
		default:
			continue // an API allocation: not the config's business
		}
		if err := removeStored(ctx, cfg, rec, why); err != nil {
			return err
		}
	}
	for _, s := range cfg.ConfigAllocations {
		spec := want[s.ID]
		if err := putConfigured(ctx, cfg, spec, stored[spec.ID]); err != nil {
			return err
		}
	}
	return nil
}

// removeStored deregisters a stored allocation whose actor was never
// started in this run: its leftover process (from a killed agent) is
// killed, its socket directory (when the agent chose it) removed and its
// record deleted.
func removeStored(ctx context.Context, cfg Config, rec persistence.Allocation, why string) error {
	log := cfg.Log.WithFields(logrus.Fields{"alloc": rec.ID, "plugin": rec.Plugin, "seq": rec.Seq})
	killLeftover(ctx, log, cfg.DataDir, rec)
	removeLeftoverContainers(ctx, cfg, log, rec)
	if len(rec.Command) > 0 || rec.Image != nil {
		if err := os.RemoveAll(filepath.Dir(plugin.SocketPath(cfg.DataDir, rec.ID))); err != nil {
			log.WithError(err).Warn("remove socket directory")
		}
	}
	if err := cfg.Store.DeleteAllocation(ctx, rec.ID); err != nil {
		return fmt.Errorf("%w: deregister %s: %w", ErrStore, rec.ID, err)
	}
	entry := log.WithField("source", sourceOf(rec.Source))
	if sourceOf(rec.Source) == SourceAPI {
		entry.Warn("allocation deregistered: " + why)
	} else {
		entry.Info("allocation deregistered: " + why)
	}
	return nil
}

// putConfigured stores the config's spec for its ID; old is the stored
// record of that ID (zero when there is none).
func putConfigured(ctx context.Context, cfg Config, spec plugin.Spec, old persistence.Allocation) error {
	log := cfg.Log.WithFields(logrus.Fields{"alloc": spec.ID, "plugin": spec.Plugin})
	now := time.Now()
	var rec persistence.Allocation
	var what string
	switch {
	case old.ID == "":
		rec = recordFromSpec(spec)
		rec.HealthMsg = "starting"
		rec.CreatedAt = now
		what = "allocation registered from the config file"
	case storedSpec(old, cfg.DataDir).Equal(spec):
		if sourceOf(old.Source) == SourceConfig {
			return nil // as configured
		}
		rec = old
		what = "allocation registered through the API is now managed by the config file"
	default:
		// A changed spec is a new instance in the same configured slot:
		// the store keeps the ID's Seq. Nothing of the old instance is
		// kept but its creation time, and a process it left running.
		log = log.WithField("changed", specDiff(storedSpec(old, cfg.DataDir), spec))
		rec = recordFromSpec(spec)
		rec.HealthMsg = "starting"
		rec.CreatedAt = old.CreatedAt
		if !killLeftover(ctx, log, cfg.DataDir, old) {
			// Maybe still there: the new actor tries again before it
			// starts its own process.
			rec.PID, rec.PIDStart = old.PID, old.PIDStart
		}
		if old.Image != nil && (spec.Image == nil || spec.Image.EngineName() != old.Image.EngineName()) {
			// On the same engine the new actor replaces it (it adopts
			// only a container created for its own spec).
			removeLeftoverContainers(ctx, cfg, log, old)
		}
		if len(old.Command) > 0 && !spec.ExecManaged() {
			if err := os.RemoveAll(filepath.Dir(plugin.SocketPath(cfg.DataDir, old.ID))); err != nil {
				log.WithError(err).Warn("remove socket directory")
			}
		}
		what = "allocation replaced: its spec changed in the config file (seq kept)"
	}
	rec.Source = string(SourceConfig)
	rec.UpdatedAt = now
	saved, err := cfg.Store.PutAllocation(ctx, rec)
	if err != nil {
		return fmt.Errorf("%w: register %s: %w", ErrStore, spec.ID, err)
	}
	log.WithField("seq", saved.Seq).Info(what)
	return nil
}

// killLeftover kills the plugin process (and its log shim) an earlier
// agent left running for rec, if it still runs: plugins outlive the agent,
// so an allocation removed from the config file or replaced in it has its
// old process stopped here. It reports false when the process may still
// be there.
func killLeftover(ctx context.Context, log *logrus.Entry, dataDir string, rec persistence.Allocation) bool {
	if len(rec.Command) == 0 {
		return true
	}
	kctx, cancel := context.WithTimeout(ctx, leftoverKillTimeout)
	defer cancel()
	killed, err := proc.KillLeftover(kctx, filepath.Dir(plugin.SocketPath(dataDir, rec.ID)), rec.PID, rec.PIDStart)
	switch {
	case err != nil:
		log.WithError(err).WithField("pid", rec.PID).Error("could not kill the plugin process left by a previous agent")
		return false
	case killed:
		log.WithField("pid", rec.PID).Warn("killed the plugin process left by a previous agent")
	}
	return true
}

// removeLeftoverContainers removes the containers an earlier agent left
// for the image allocation rec, which this run no longer has (removed
// from the config file, or moved to another engine or off images): they
// outlive the agent as processes do. An engine that does not answer
// leaves them, logged with the name to remove them by.
func removeLeftoverContainers(ctx context.Context, cfg Config, log *logrus.Entry, rec persistence.Allocation) {
	ls := cfg.Plugin.Containers
	if rec.Image == nil || ls == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, leftoverKillTimeout)
	defer cancel()
	engine := rec.Image.EngineName()
	if err := ls.RemoveAll(rctx, engine, rec.ID, log); err != nil {
		log.WithError(err).WithField("container", ls.Name(rec.ID)).Error("could not remove the plugin container left by a previous agent: remove it by hand")
	}
}

// storedSpec is the spec of a stored allocation, with the socket of an
// exec-managed one as this run's data dir makes it.
func storedSpec(rec persistence.Allocation, dataDir string) plugin.Spec {
	s := specFromRecord(rec)
	if s.ExecManaged() {
		s.Socket = plugin.SocketPath(dataDir, s.ID)
	}
	return s
}
