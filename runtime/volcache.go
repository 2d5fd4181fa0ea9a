package runtime

import (
	"container/list"
	"context"
	"errors"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// DefaultVolumeCache is the default of cluster.volume_cache: how many
// volume definitions a host keeps beyond those it has claims on.
const DefaultVolumeCache = 2000

// volumeCache orders, most recently used first, the volumes this host
// keeps a record of in cluster mode. A host keeps the volumes it has
// claims (or past claims) on, and of the others at most max, the most
// recently used: evict forgets the rest here (etcd keeps them). A volume
// in use by a call of the runtime (pinned) is never evicted, and a pin
// waits for an eviction under way.
type volumeCache struct {
	max  int
	kick chan struct{} // wakes the evictor; buffered, one pending

	mu    sync.Mutex
	order *list.List               // guarded by mu; of *cacheEntry, front: most recent
	at    map[string]*list.Element // guarded by mu
}

type cacheEntry struct {
	id       string
	pins     int           // calls using the volume now
	evicting chan struct{} // closed when the eviction under way ends; nil when none
}

func newVolumeCache(max int) *volumeCache {
	return &volumeCache{max: max, kick: make(chan struct{}, 1), order: list.New(), at: map[string]*list.Element{}}
}

// pin marks id used now and in use until unpin, waiting for an eviction
// of it under way to end first.
func (c *volumeCache) pin(id string) {
	c.mu.Lock()
	for {
		el := c.at[id]
		if el == nil {
			el = c.order.PushFront(&cacheEntry{id: id})
			c.at[id] = el
		}
		e := el.Value.(*cacheEntry)
		if e.evicting == nil {
			e.pins++
			c.order.MoveToFront(el)
			c.mu.Unlock()
			return
		}
		ch := e.evicting
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
}

// unpin ends a pin; it returns whether no pin of id is left.
func (c *volumeCache) unpin(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.at[id]
	if el == nil {
		return true
	}
	e := el.Value.(*cacheEntry)
	e.pins--
	c.wakeLocked()
	return e.pins <= 0
}

// pinned reports whether a call uses volume id now.
func (c *volumeCache) pinned(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.at[id]
	return el != nil && el.Value.(*cacheEntry).pins > 0
}

// touch marks id used now (a volume this host keeps).
func (c *volumeCache) touch(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.at[id]; el != nil {
		c.order.MoveToFront(el)
	} else {
		c.at[id] = c.order.PushFront(&cacheEntry{id: id})
	}
	c.wakeLocked()
}

// drop forgets id (the volume is no longer kept here), unless it is
// pinned or being evicted.
func (c *volumeCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.at[id]; el != nil {
		if e := el.Value.(*cacheEntry); e.pins == 0 && e.evicting == nil {
			c.order.Remove(el)
			delete(c.at, id)
		}
	}
}

func (c *volumeCache) wakeLocked() {
	if c.order.Len() > c.max {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// len returns how many volumes the cache orders.
func (c *volumeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// candidates returns the IDs of the least recently used volumes that are
// neither pinned nor being evicted, oldest first, at most n.
func (c *volumeCache) candidates(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for el := c.order.Back(); el != nil && len(out) < n; el = el.Prev() {
		if e := el.Value.(*cacheEntry); e.pins == 0 && e.evicting == nil {
			out = append(out, e.id)
		}
	}
	return out
}

// startEvicting marks id being evicted, unless it is pinned (or gone);
// call the function it returns when the eviction ends, with whether it
// forgot the volume.
func (c *volumeCache) startEvicting(id string) (func(gone bool), bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.at[id]
	if el == nil {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if e.pins > 0 || e.evicting != nil {
		return nil, false
	}
	e.evicting = make(chan struct{})
	return func(gone bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		close(e.evicting)
		e.evicting = nil
		if gone && c.at[id] == el {
			c.order.Remove(el)
			delete(c.at, id)
		} else if !gone {
			// Kept (claimed here, or a record etcd does not have):
			// it goes to the front, so the next round tries others.
			c.order.MoveToFront(el)
		}
	}, true
}

// hold makes sure this host has a record of volume id for a call that
// needs one (claims, updates, expansions, deletes, reads), reading the
// cluster's definition from etcd when it does not (ErrNotFound when etcd
// has none), and keeps it from eviction until the call ends: call the
// function it returns then. Outside cluster mode it does nothing.
func (r *Runtime) hold(ctx context.Context, id string) (func(), error) {
	if r.cluster == nil {
		return func() {}, nil
	}
	r.cache.pin(id)
	release := func() { r.unhold(id) }
	if r.volumes.Known(id) {
		return release, nil
	}
	raw, rev, err := r.cluster.VolumeDefRev(ctx, id)
	if err == nil && raw == nil {
		err = kinderr.Errorf(ErrNotFound, "volume %q not found", id)
	}
	if err != nil {
		release()
		return nil, mapErr(err)
	}
	cv, _, err := decodeClusterVolume(id, raw, r.keys)
	if err == nil {
		_, err = r.mirror(ctx, cv, rev)
	}
	if err != nil {
		release()
		return nil, mapErr(err)
	}
	return release, nil
}

// unhold ends a hold of volume id; a volume left without a record here
// (gone from the cluster meanwhile) is forgotten.
func (r *Runtime) unhold(id string) {
	if !r.cache.unpin(id) || r.volumes.Known(id) {
		return
	}
	r.mirrorMu.Lock()
	defer r.mirrorMu.Unlock()
	if !r.volumes.Known(id) && !r.cache.pinned(id) {
		delete(r.mirrored, id)
		r.cache.drop(id)
	}
}

// externalOf returns the plugin and external ID of this host's record of
// volume id, empty when it has none.
func (r *Runtime) externalOf(ctx context.Context, id string) (plugin, ext string) {
	v, err := r.volumes.Get(ctx, id)
	if err != nil {
		return "", ""
	}
	return v.Plugin, v.ExternalID
}

// forgetExternal removes the cluster's record that the plugin volume ext
// of plugin is volume id, deregistered now; a failure is logged (the
// record left behind is harmless, see cluster.Session.ForgetExternal).
func (r *Runtime) forgetExternal(ctx context.Context, id, plugin, ext string) {
	if r.cluster == nil || ext == "" {
		return
	}
	if err := r.cluster.ForgetExternal(ctx, id, plugin, ext); err != nil {
		r.log.WithFields(logrus.Fields{"component": "cluster", "volume": id}).WithError(err).Info("cannot remove the record of a deregistered volume's plugin volume from etcd; left behind")
	}
}

// keeps reports whether this host keeps volume id (has a record of it, or
// a call is bringing one): the cluster's changes of other volumes are
// not applied here.
func (r *Runtime) keeps(id string) bool {
	return r.volumes.Known(id) || r.cache.pinned(id)
}

// evictLoop forgets the least recently used volumes this host keeps
// beyond cluster.volume_cache, and has no claim on, until ctx ends.
func (r *Runtime) evictLoop(ctx context.Context) {
	defer r.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cache.kick:
		}
		r.evictOver(ctx)
	}
}

// evictOver evicts volumes until the cache is within its size or every
// candidate was tried once.
func (r *Runtime) evictOver(ctx context.Context) {
	over := r.cache.len() - r.cache.max
	if over <= 0 {
		return
	}
	for _, id := range r.cache.candidates(r.cache.len()) {
		if over <= 0 || ctx.Err() != nil {
			return
		}
		if r.evict(ctx, id) {
			over--
		}
	}
}

// evict forgets this host's record of volume id when etcd has its
// definition and the host no claim or past claim on it, and reports
// whether it did.
func (r *Runtime) evict(ctx context.Context, id string) bool {
	end, ok := r.cache.startEvicting(id)
	if !ok {
		return false
	}
	gone := false
	defer func() { end(gone) }()
	r.mirrorMu.Lock()
	defer r.mirrorMu.Unlock()
	if !r.cluster.Holds(id) {
		// Not (yet) applied from etcd: a record of this host only, or
		// one whose definition the watch has not read again.
		return false
	}
	err := r.volumes.Evict(ctx, id)
	switch {
	case err == nil, errors.Is(err, volume.ErrNotFound):
		gone = true
	case errors.Is(err, volume.ErrInUse), errors.Is(err, volume.ErrConflict):
		return false
	default:
		r.log.WithFields(logrus.Fields{"component": "cluster", "volume": id}).WithError(err).Warn("cannot forget a volume definition beyond cluster.volume_cache")
		return false
	}
	delete(r.mirrored, id)
	r.cluster.Forget(id)
	return true
}
