package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func (s *Session) volumeKey(id string) string { return s.key("volumes", id) }

// PutVolume records volume id's definition (opaque to the cluster; the
// caller encodes it deterministically) for every host, and that this
// host's record has it (see Applied). The same definition again is a
// no-op; another one is ErrConflict.
func (s *Session) PutVolume(ctx context.Context, id string, def []byte) error {
	return s.PutVolumeOf(ctx, id, "", "", def)
}

// externalKey is the key that names the volume ID the plugin volume
// externalID of plugin is registered as.
func (s *Session) externalKey(plugin, externalID string) string {
	return s.key("external", url.PathEscape(plugin), url.PathEscape(externalID))
}

// PutVolumeOf is PutVolume for the plugin volume externalID of plugin
// (none when externalID is empty): it also records that the plugin volume
// is registered as id, in the same transaction, and fails with
// ErrConflict naming the other ID when another volume of the cluster is
// registered for it (one plugin volume has one ID at most, so that the
// claim limits of its access mode hold across hosts).
func (s *Session) PutVolumeOf(ctx context.Context, id, plugin, externalID string, def []byte) error {
	key := s.volumeKey(id)
	for range maxCAS {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
		ops := []clientv3.Op{clientv3.OpPut(key, string(def))}
		if externalID != "" {
			xk := s.externalKey(plugin, externalID)
			owner, xrev, err := s.ExternalOwner(ctx, plugin, externalID)
			if err != nil {
				return err
			}
			if owner != "" && owner != id {
				return fmt.Errorf("%w: plugin %s's volume %q is registered in the cluster as volume %q", ErrConflict, plugin, externalID, owner)
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(xk), "=", xrev))
			ops = append(ops, clientv3.OpPut(xk, id))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(key)).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return fmt.Errorf("%w: register volume %q: %w", ErrUnavailable, id, err)
		}
		if resp.Succeeded {
			s.Applied(id, resp.Header.Revision)
			return nil
		}
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			if bytes.Equal(kvs[0].Value, def) {
				s.Applied(id, kvs[0].ModRevision)
				return nil
			}
			return fmt.Errorf("%w: volume %q is registered in the cluster with a different definition", ErrConflict, id)
		}
		// The plugin volume's record changed meanwhile: read it again.
	}
	return fmt.Errorf("%w: the record of volume %q kept changing", ErrUnavailable, id)
}

// ExternalOwner returns the ID the plugin volume externalID of plugin is
// registered as in the cluster, empty when none (or when that volume was
// deregistered since), and the mod revision of the record that says so
// (0 for none).
func (s *Session) ExternalOwner(ctx context.Context, plugin, externalID string) (string, int64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	xk := s.externalKey(plugin, externalID)
	start := time.Now()
	resp, err := s.cli.Get(rctx, xk)
	s.metrics.observe("get", start)
	if err != nil {
		return "", 0, fmt.Errorf("%w: read the ID of plugin %s's volume %q: %w", ErrUnavailable, plugin, externalID, err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, nil
	}
	owner, rev := string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
	def, _, err := s.VolumeDefRev(ctx, owner)
	if err != nil {
		return "", 0, err
	}
	if def == nil {
		return "", rev, nil // deregistered: the record is free
	}
	return owner, rev, nil
}

// ForgetExternal removes the record that the plugin volume externalID of
// plugin is registered as id (after id was deregistered), unless it names
// another volume. A record left behind is harmless: ExternalOwner checks
// that its volume is still there.
func (s *Session) ForgetExternal(ctx context.Context, id, plugin, externalID string) error {
	xk := s.externalKey(plugin, externalID)
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	_, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.Value(xk), "=", id)).Then(clientv3.OpDelete(xk)).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return fmt.Errorf("%w: forget the ID of plugin %s's volume %q: %w", ErrUnavailable, plugin, externalID, err)
	}
	return nil
}

// UpdateVolume replaces volume id's definition, read at mod revision rev
// (VolumeDefRev), with def, and returns the new revision. With unclaimed,
// only while no host holds a claim on the volume (this host's claims
// being freed hold none): ErrInUse otherwise, naming each claim and its
// host. A definition changed or removed since rev is ErrConflict: read it
// again.
func (s *Session) UpdateVolume(ctx context.Context, id string, rev int64, def []byte, unclaimed bool) (int64, error) {
	key, ck := s.volumeKey(id), s.claimsKey(id)
	for range maxCAS {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)}
		if unclaimed {
			crev, err := s.unclaimed(ctx, id)
			if err != nil {
				return 0, err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(ck), "=", crev))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(cmps...).Then(clientv3.OpPut(key, string(def))).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return 0, fmt.Errorf("%w: update volume %q: %w", ErrUnavailable, id, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].ModRevision != rev {
			return 0, fmt.Errorf("%w: the definition of volume %q changed meanwhile", ErrConflict, id)
		}
		// The claims changed meanwhile: look at them again.
	}
	return 0, fmt.Errorf("%w: the claims of volume %q kept changing", ErrUnavailable, id)
}

// unclaimed returns the mod revision of volume id's claims document (0
// for none) when no host holds a claim on the volume but this host's
// claims being freed (see pendingFrees), and ErrInUse naming each claim
// and its host otherwise.
func (s *Session) unclaimed(ctx context.Context, id string) (int64, error) {
	freeing := s.pendingFrees(id) // before the read, as in Admit
	d, rev, err := s.readClaims(ctx, id)
	if err != nil {
		return 0, err
	}
	s.dropFreed(freeing, &d)
	if len(d.Claims) == 0 {
		return rev, nil
	}
	sortClaims(d.Claims)
	held := make([]string, 0, len(d.Claims))
	for _, c := range d.Claims {
		held = append(held, fmt.Sprintf("alloc %q on host %q", c.Alloc, c.Host))
	}
	return 0, fmt.Errorf("%w: volume %q is claimed by %s", ErrInUse, id, strings.Join(held, ", "))
}

// DeleteVolume removes volume id's definition, unless a host holds a
// claim on it (ErrInUse, naming each claim and its host). This host's
// claims being freed go with it. A volume that is not there is not an
// error.
func (s *Session) DeleteVolume(ctx context.Context, id string) error {
	ck := s.claimsKey(id)
	for range maxCAS {
		crev, err := s.unclaimed(ctx, id)
		if err != nil {
			return err
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", crev)).
			Then(clientv3.OpDelete(s.volumeKey(id)), clientv3.OpDelete(ck)).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return fmt.Errorf("%w: deregister volume %q: %w", ErrUnavailable, id, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%w: the claims of volume %q kept changing", ErrUnavailable, id)
}

// VolumeEvent is a change of a volume definition: Def is nil when the
// volume was deregistered. Rev is the etcd revision of the change (of the
// definition's last change, for a listed one): a later change has a
// higher one.
type VolumeEvent struct {
	ID  string
	Def []byte
	Rev int64
}

// heldBatch bounds the keys one transaction reads when WatchVolumes
// reads the definitions of the volumes this host holds (etcd's default
// limit of operations in one transaction is 128).
const heldBatch = 64

// MaxVolumePage is the most definitions VolumePage returns at once.
const MaxVolumePage = 1000

// WatchVolumes reads the definition of every volume held returns (the
// volumes this host keeps: it never lists the cluster's), calls fn with
// each one etcd has, then calls fn with every change of any volume
// definition, in order, until ctx ends: fn decides which it keeps, and
// runs on WatchVolumes's goroutine. When the watch breaks (etcd
// unreachable, history compacted) it reads the held ones again and calls
// fn with each once more, so fn must be idempotent; a volume deregistered
// meanwhile gets no call (its deletion is not seen). listed, if not nil,
// is called after each complete read, before the changes that follow it.
// It returns ctx's error.
func (s *Session) WatchVolumes(ctx context.Context, held func() []string, fn func(VolumeEvent), listed func()) error {
	prefix := s.volumeKey("")
	for {
		rev, err := s.readHeld(ctx, prefix, held(), fn)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.WithError(err).Warn("cannot read the volume definitions this host holds; retrying")
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		if listed != nil {
			listed()
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if wr.Err() != nil {
				s.log.WithError(wr.Err()).Info("volume definition watch broke; reading the held ones again")
				break
			}
			for _, e := range wr.Events {
				ev := VolumeEvent{ID: strings.TrimPrefix(string(e.Kv.Key), prefix), Rev: e.Kv.ModRevision}
				if e.Type == clientv3.EventTypePut {
					ev.Def = e.Kv.Value
				}
				fn(ev)
			}
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// readHeld calls fn with the definition of each of ids that etcd has,
// read heldBatch keys per transaction, and returns the revision of the
// first read: every change after it is still to be watched (a change
// between two reads is seen twice, which fn allows).
func (s *Session) readHeld(ctx context.Context, prefix string, ids []string, fn func(VolumeEvent)) (int64, error) {
	var rev int64
	for {
		n := min(len(ids), heldBatch)
		ops := make([]clientv3.Op, 0, max(n, 1))
		for _, id := range ids[:n] {
			ops = append(ops, clientv3.OpGet(prefix+id))
		}
		if n == 0 {
			// Only the revision: the prefix key itself is never a volume.
			ops = append(ops, clientv3.OpGet(prefix, clientv3.WithCountOnly()))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for i := range n {
			for _, kv := range resp.Responses[i].GetResponseRange().GetKvs() {
				fn(VolumeEvent{ID: ids[i], Def: kv.Value, Rev: kv.ModRevision})
			}
		}
		if ids = ids[n:]; len(ids) == 0 {
			return rev, nil
		}
	}
}

// VolumePage returns, in ID order, at most limit (1 to MaxVolumePage)
// volume definitions whose ID is from or sorts after it, read in one
// request; next is the ID of the definition after them, empty when there
// is none.
func (s *Session) VolumePage(ctx context.Context, from string, limit int) (page []VolumeEvent, next string, err error) {
	if limit < 1 || limit > MaxVolumePage {
		return nil, "", fmt.Errorf("page of %d volumes: want 1 to %d", limit, MaxVolumePage)
	}
	prefix := s.volumeKey("")
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, prefix+from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(int64(limit+1)))
	s.metrics.observe("get", start)
	if err != nil {
		return nil, "", fmt.Errorf("%w: list volumes: %w", ErrUnavailable, err)
	}
	kvs := resp.Kvs
	if len(kvs) > limit {
		next = strings.TrimPrefix(string(kvs[limit].Key), prefix)
		kvs = kvs[:limit]
	}
	page = make([]VolumeEvent, 0, len(kvs))
	for _, kv := range kvs {
		page = append(page, VolumeEvent{ID: strings.TrimPrefix(string(kv.Key), prefix), Def: kv.Value, Rev: kv.ModRevision})
	}
	return page, next, nil
}

// VolumeIDs returns the IDs of every volume definition in etcd, sorted,
// read in pages.
func (s *Session) VolumeIDs(ctx context.Context) ([]string, error) {
	var ids []string
	for from := ""; ; {
		page, next, err := s.VolumePage(ctx, from, MaxVolumePage)
		if err != nil {
			return nil, err
		}
		for _, e := range page {
			ids = append(ids, e.ID)
		}
		if next == "" {
			return ids, nil
		}
		from = next
	}
}

// ClaimsBetween returns the claims of every host on the volumes from first
// to last (their IDs, both included) that have one, by volume ID, read in
// one request: the claims of a page of VolumePage.
func (s *Session) ClaimsBetween(ctx context.Context, first, last string) (map[string][]HostClaim, error) {
	prefix := s.claimsKey("")
	return s.claimsRange(ctx, prefix+first, prefix+last+"\x00")
}

// Forget drops what this host recorded of volume id's definition (see
// Applied), when it no longer keeps the volume: a claim on it later is
// admitted after the definition is applied again.
func (s *Session) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.applied, id)
}

// Applied records that this host's record of volume id has the
// definition etcd held at mod revision rev (0: none), as the caller
// mirrored it. From then on, Admit admits a claim on the volume only
// while etcd's definition is still that one (StaleError otherwise), so
// that no claim is published with a definition another host replaced
// meanwhile. A volume never applied is admitted without that check.
func (s *Session) Applied(id string, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied[id] = rev
	close(s.appliedCh)
	s.appliedCh = make(chan struct{})
}

// WaitApplied waits until this host applies a definition of volume id
// other than the one at revision old (a StaleError's Applied), or ctx
// ends.
func (s *Session) WaitApplied(ctx context.Context, id string, old int64) error {
	for {
		s.mu.Lock()
		rev, ch := s.applied[id], s.appliedCh
		s.mu.Unlock()
		if rev != old {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Holds reports whether this host applied a definition of volume id from
// etcd (see Applied) and has not forgotten it since (see Forget).
func (s *Session) Holds(id string) bool {
	_, ok := s.appliedRev(id)
	return ok
}

// appliedRev returns the revision of volume id's definition this host
// applied, and whether it applied one.
func (s *Session) appliedRev(id string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev, ok := s.applied[id]
	return rev, ok
}
