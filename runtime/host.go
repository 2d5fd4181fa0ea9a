package runtime

import (
	"context"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/persistence"
)

// hostCheck compares the host with the store: the boot ID at start, and
// the mount table, with every listed mount probed, whenever an allocation
// becomes healthy again (its mounts may have died with its process) and
// every volumes.mount_check_interval. Its health map belongs to the goroutine
// that forwards registry events; its run goroutine owns the checks.
type hostCheck struct {
	cfg     HostConfig
	every   time.Duration // the periodic check of every plugin's mounts; <= 0: none
	log     *logrus.Entry
	recheck chan string     // plugins to check, from the forwarder to run
	healthy map[string]bool // by allocation; the forwarder's own
}

// recheckBacklog is how many plugin checks may wait for the run goroutine
// before the registry forwarder waits too.
const recheckBacklog = 64

func newHostCheck(cfg HostConfig, every time.Duration, log *logrus.Entry) *hostCheck {
	if cfg.SkipMountCheck {
		every = 0
	}
	return &hostCheck{cfg: cfg, every: every, log: log, recheck: make(chan string, recheckBacklog), healthy: map[string]bool{}}
}

// bootChanged reads the host's boot ID and compares it with the stored
// one. It returns the boot ID to record once the repairs are ("" when it
// cannot be read or is recorded already) and whether the host rebooted
// since the last run. A
// store without a boot ID (a new one, or one written before the boot ID
// was recorded) is not a reboot: the mount table check still runs.
func (h *hostCheck) bootChanged(ctx context.Context, st *persistence.Store) (string, bool) {
	file := h.cfg.BootIDFile
	if file == "" {
		file = DefaultBootIDFile
	}
	raw, err := os.ReadFile(file)
	id := strings.TrimSpace(string(raw))
	if err != nil || id == "" || len(id) > persistence.MaxBootIDLen {
		h.log.WithError(err).WithField("file", file).Warn("cannot read the host's boot ID; a reboot will not be noticed (the mount table is still checked)")
		return "", false
	}
	prev, err := st.BootID(ctx)
	if err != nil {
		h.log.WithError(err).Warn("cannot read the recorded boot ID; a reboot will not be noticed (the mount table is still checked)")
		return "", false
	}
	switch prev {
	case id:
		return "", false // recorded already
	case "":
		return id, false
	}
	h.log.WithFields(logrus.Fields{"was": prev, "now": id}).
		Warn("the host rebooted since the last run (boot ID changed): every claim is published again")
	return id, true
}

// healthChanged runs on the forwarder for every health event: an
// allocation that becomes healthy (first seen, or again after an outage or
// a restart) gets its plugin's claims checked against the mount table.
func (h *hostCheck) healthChanged(done <-chan struct{}, alloc, plugin string, healthy bool) {
	was, seen := h.healthy[alloc]
	h.healthy[alloc] = healthy
	if !healthy || (seen && was) || h.cfg.SkipMountCheck {
		return
	}
	select {
	case h.recheck <- plugin:
	case <-done:
	}
}

// lagged runs on the forwarder when it lost registry events: a health
// change may be among them, so every plugin's claims are checked.
func (h *hostCheck) lagged(done <-chan struct{}) {
	if h.cfg.SkipMountCheck {
		return
	}
	select {
	case h.recheck <- "": // every plugin
	case <-done:
	}
}

// deregistered forgets an allocation's health (on the forwarder).
func (h *hostCheck) deregistered(alloc string) { delete(h.healthy, alloc) }

// run checks the plugins healthChanged asks for, each once however often
// it was asked while a check ran, until done is closed.
func (h *hostCheck) run(done <-chan struct{}, vols *volume.Manager, wg *sync.WaitGroup) {
	defer wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with run: done closes or run's cancel fires
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	// The periodic check: every plugin's mounts (volumes.mount_check_interval).
	var tick <-chan time.Time
	if h.every > 0 {
		t := time.NewTicker(h.every)
		defer t.Stop()
		tick = t.C
	}
	for {
		var plugin string
		select {
		case plugin = <-h.recheck:
		case <-tick:
			plugin = "" // every plugin
		case <-done:
			return
		}
		todo := map[string]struct{}{plugin: {}}
	drain:
		for {
			select {
			case p := <-h.recheck:
				todo[p] = struct{}{}
			default:
				break drain
			}
		}
		for p := range todo {
			res, err := vols.Reconcile(ctx, volume.ReconcileOptions{Plugin: p})
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				h.log.WithError(err).WithField("plugin", p).Error("cannot check the plugin's claims against the host")
			case res.Claims > 0:
				h.log.WithFields(logrus.Fields{"plugin": p, "volumes": res.Volumes, "claims": res.Claims}).
					Warn("an allocation came back without some of its plugin's mounts; publishing them again")
			}
		}
	}
}
