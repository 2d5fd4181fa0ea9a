package volume

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/secretfile"
	"github.com/csiactor/csiactor/persistence"
)

// EventVolumesRegistered is the one event of a RegisterBatch that
// registered new volumes: its message gives how many and the first IDs
// (volume-registered events, one per volume, would flood the event stream
// and push every other event out of its history at 100,000 volumes).
const EventVolumesRegistered = "volumes-registered"

// batchValidators bounds the ValidateVolumeCapabilities calls of one
// RegisterBatch in flight at once (the runner's per-plugin limit applies
// too).
const batchValidators = 16

// batchEventIDs is how many volume IDs the EventVolumesRegistered message
// names.
const batchEventIDs = 10

// RegisterBatch registers specs, volumes the plugins already have, each as
// Register would, and returns one error per spec in specs' order (nil: the
// volume is registered). One spec's refusal does not stop the others.
//
// The volumes new to this host (not registered, no actor) are validated
// with their plugin (ValidateVolumeCapabilities, by Register's rules, at
// most batchValidators calls at a time) and the ones accepted are written
// in one store commit (PutVolumes): on a crash they are all registered or
// none is. Their event is one EventVolumesRegistered; no actor starts for
// them until a request does. A spec whose ID is registered already goes
// through Register (the same spec again is a no-op, another one an
// update). A spec whose ID or plugin volume an earlier spec of the batch
// has is refused (ErrInvalid, ErrConflict) and so is one whose plugin
// volume is registered under another ID. While the batch runs, a request
// that would start the actor of one of its new volumes fails with
// ErrConflict ("being registered by a batch").
func (m *Manager) RegisterBatch(ctx context.Context, specs []Spec) []error {
	return m.registerBatch(ctx, specs, nil)
}

// RegisterBatchWith is RegisterBatch for volumes whose records another
// store keeps (the cluster's etcd): the volumes new to this host are
// validated, and reserved while the batch runs, as RegisterBatch does,
// but not written here. commit gets the indexes in specs of every spec
// accepted (the new ones validated, and those registered here already,
// after Register) and returns one error per index (nil: written there);
// the new ones it wrote make one EventVolumesRegistered. This host keeps
// no record of them until a request reads one.
func (m *Manager) RegisterBatchWith(ctx context.Context, specs []Spec, commit func(accepted []int) []error) []error {
	return m.registerBatch(ctx, specs, commit)
}

func (m *Manager) registerBatch(ctx context.Context, specs []Spec, commit func([]int) []error) []error {
	errs := make([]error, len(specs))
	var fresh, known []int // indexes into specs
	seen := make(map[string]int, len(specs))
	for i, s := range specs {
		if err := s.validate(false); err != nil {
			errs[i] = err
			continue
		}
		if j, dup := seen[s.ID]; dup {
			errs[i] = kinderr.Errorf(ErrInvalid, "volume %q is given twice in the batch (entries %d and %d)", s.ID, j, i)
			continue
		}
		seen[s.ID] = i
	}
	if err := m.reserveBatch(specs, errs, &fresh, &known); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	defer m.releaseBatch(specs, fresh)

	registered := make(chan struct{})
	go func() {
		defer close(registered)
		parallel(len(known), batchValidators, func(k int) {
			i := known[k]
			_, errs[i] = m.Register(ctx, specs[i])
		})
	}()
	defer func() { <-registered }()
	notes := make([]string, len(specs))
	noteErrs := make([]error, len(specs))
	parallel(len(fresh), batchValidators, func(k int) {
		i := fresh[k]
		notes[i], noteErrs[i], errs[i] = m.validateNew(ctx, specs[i])
	})
	m.logNotes(specs, fresh, errs, notes, noteErrs)
	now := time.Now()
	if commit != nil {
		<-registered
		m.commitBatch(specs, fresh, errs, commit, now)
		return errs
	}
	var recs []persistence.Volume
	var written []int
	for _, i := range fresh {
		if errs[i] != nil {
			continue
		}
		v := specs[i].record(now)
		v.Revision, v.UpdatedAt = 1, now
		recs = append(recs, *v)
		written = append(written, i)
	}
	if len(recs) == 0 {
		return errs
	}
	// Not canceled with ctx, as a volume actor's writes are not: once
	// validated, the records are written whole or fail, never left to
	// chance by a caller that went away.
	if err := m.store.PutVolumes(context.WithoutCancel(ctx), recs); err != nil {
		err = fmt.Errorf("persist %d volumes: %w", len(recs), err)
		for _, i := range written {
			errs[i] = err
		}
		return errs
	}
	m.mu.Lock()
	for _, i := range written {
		m.index[specs[i].ID] = struct{}{}
	}
	m.mu.Unlock()
	m.recordBatch(specs, written, now)
	return errs
}

// commitBatch hands the accepted specs (errs[i] nil) to commit and
// records its answers in errs; the fresh ones it wrote make the batch's
// event.
func (m *Manager) commitBatch(specs []Spec, fresh []int, errs []error, commit func([]int) []error, now time.Time) {
	var accepted []int
	for i := range specs {
		if errs[i] == nil {
			accepted = append(accepted, i)
		}
	}
	if len(accepted) == 0 {
		return
	}
	for k, err := range commit(accepted) {
		errs[accepted[k]] = err
	}
	var written []int
	for _, i := range fresh {
		if errs[i] == nil {
			written = append(written, i)
		}
	}
	if len(written) > 0 {
		m.recordBatch(specs, written, now)
	}
}

// reserveBatch sorts the valid specs (errs[i] nil) into fresh, new to this
// host, and known, registered already or with an actor, and reserves the
// fresh ones' IDs and plugin volumes (see Manager.batching), refusing a
// plugin volume registered under another ID or given twice.
func (m *Manager) reserveBatch(specs []Spec, errs []error, fresh, known *[]int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrShutdown
	}
	if !m.started {
		return fmt.Errorf("%w: manager not started", ErrInvalid)
	}
	if m.batching == nil {
		m.batching = map[string]struct{}{}
	}
	for i, s := range specs {
		if errs[i] != nil {
			continue
		}
		_, registered := m.index[s.ID]
		_, live := m.live[s.ID]
		_, other := m.batching[s.ID]
		switch {
		case other:
			errs[i] = kinderr.Errorf(ErrConflict, "volume %q is being registered by another batch; try again", s.ID)
		case registered || live:
			*known = append(*known, i)
		default:
			k := extKey{s.Plugin, s.ExternalID}
			if err := m.extConflictLocked(k, s.ID); err != nil {
				errs[i] = err
				continue
			}
			m.addExtLocked(k, s.ID)
			m.batching[s.ID] = struct{}{}
			*fresh = append(*fresh, i)
		}
	}
	return nil
}

// releaseBatch ends the reservation of the fresh specs: the plugin volume
// of one that was not written is free again.
func (m *Manager) releaseBatch(specs []Spec, fresh []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, i := range fresh {
		s := specs[i]
		delete(m.batching, s.ID)
		if _, ok := m.index[s.ID]; !ok {
			m.dropExtLocked(extKey{s.Plugin, s.ExternalID}, s.ID)
		}
	}
}

// validateNew asks spec's plugin to validate it (ValidateVolumeCapabilities)
// and returns the error that refuses it, or nil; a note (with the
// plugin's error, if any) says why a volume is registered without
// validation: see Register and validationOutcome.
func (m *Manager) validateNew(ctx context.Context, spec Spec) (note string, noteErr, err error) {
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	vreq := spec.validateRequest()
	if vreq.Secrets, err = readSecrets(spec.ID, spec.Secrets, spec.SecretsFrom); err != nil {
		return "", nil, err
	}
	var out any
	res := m.runner.Do(ctx, spec.Plugin, claim.ControllerPlugin, csi.PublishKind, func(ctx context.Context, c csi.Client) error {
		v, err := validate(secretfile.WithRef(ctx, spec.SecretsFrom), c, vreq)
		out = v
		return err
	})
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	note, err = validationOutcome(spec, res, out)
	return note, res.Err, err
}

// logNotes logs, once per note, how many of the fresh specs (those not
// refused) were registered without validation and why, with the first
// one's volume and error: one line for a batch, not one per volume.
func (m *Manager) logNotes(specs []Spec, fresh []int, errs []error, notes []string, noteErrs []error) {
	type tally struct {
		n     int
		first int
	}
	byNote := map[string]*tally{}
	var order []string
	for _, i := range fresh {
		if errs[i] != nil || notes[i] == "" {
			continue
		}
		t := byNote[notes[i]]
		if t == nil {
			t = &tally{first: i}
			byNote[notes[i]] = t
			order = append(order, notes[i])
		}
		t.n++
	}
	for _, note := range order {
		t := byNote[note]
		log := m.log.WithFields(logrus.Fields{"volumes": t.n, "volume": specs[t.first].ID, "plugin": specs[t.first].Plugin})
		if noteErrs[t.first] != nil {
			log = log.WithError(noteErrs[t.first])
		}
		log.Info(strings.Replace(note, "registering the volume", "registering volumes of a batch", 1))
	}
}

// recordBatch reports the volumes of specs at written, registered by one
// RegisterBatch at now, as one EventVolumesRegistered.
func (m *Manager) recordBatch(specs []Spec, written []int, now time.Time) {
	m.log.WithFields(logrus.Fields{"volumes": len(written)}).Info("volumes registered in one batch")
	emit := m.cfg.OnEvent
	if emit == nil {
		return
	}
	plugin := specs[written[0]].Plugin
	ids := make([]string, 0, min(len(written), batchEventIDs))
	for _, i := range written {
		if specs[i].Plugin != plugin {
			plugin = ""
		}
		if len(ids) < batchEventIDs {
			ids = append(ids, specs[i].ID)
		}
	}
	msg := fmt.Sprintf("%d volumes registered: %s", len(written), strings.Join(ids, ", "))
	if len(written) == 1 {
		msg = "1 volume registered: " + ids[0]
	}
	if more := len(written) - len(ids); more > 0 {
		msg += fmt.Sprintf(" and %d more", more)
	}
	emit(Event{Time: now, Type: EventVolumesRegistered, Plugin: plugin, Message: msg})
}

// parallel calls fn(0) … fn(n-1) on at most workers goroutines and
// returns when every call has.
func parallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
