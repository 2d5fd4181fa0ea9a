package cluster

import (
	"bytes"
	"context"
	"fmt"
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
	key := s.volumeKey(id)
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(def))).Else(clientv3.OpGet(key)).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return fmt.Errorf("%w: register volume %q: %w", ErrUnavailable, id, err)
	}
	if resp.Succeeded {
		s.Applied(id, resp.Header.Revision)
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 && bytes.Equal(kvs[0].Value, def) {
		s.Applied(id, kvs[0].ModRevision)
		return nil
	}
	return fmt.Errorf("%w: volume %q is registered in the cluster with a different definition", ErrConflict, id)
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

// volumePage bounds the definitions one read of a listing returns, so
// that a host (re)starting in a cluster of many volumes never holds all
// of them in one response.
const volumePage = 500

// WatchVolumes calls fn with every volume definition in etcd, then with
// every change, in order, until ctx ends. fn runs on WatchVolumes's
// goroutine. When the watch breaks (etcd unreachable, history compacted)
// it lists again and calls fn with every definition once more, so fn must
// be idempotent. listed, if not nil, is called after each complete
// listing, before the changes that follow it: from the first call on,
// fn has seen every definition etcd held when the listing began. It
// returns ctx's error.
func (s *Session) WatchVolumes(ctx context.Context, fn func(VolumeEvent), listed func()) error {
	prefix := s.volumeKey("")
	for {
		rev, err := s.listVolumes(ctx, prefix, fn)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.WithError(err).Warn("cannot list volume definitions; retrying")
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
				s.log.WithError(wr.Err()).Info("volume definition watch broke; listing again")
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

// listVolumes calls fn with every definition under prefix, in pages of
// volumePage read at the revision of the first, and returns that
// revision.
func (s *Session) listVolumes(ctx context.Context, prefix string, fn func(VolumeEvent)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	var rev int64
	for from := prefix; ; {
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Get(rctx, from, clientv3.WithRange(end), clientv3.WithLimit(volumePage), clientv3.WithRev(rev))
		cancel()
		s.metrics.observe("get", start)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(VolumeEvent{ID: strings.TrimPrefix(string(kv.Key), prefix), Def: kv.Value, Rev: kv.ModRevision})
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// VolumeIDs returns the IDs of every volume definition in etcd, sorted.
func (s *Session) VolumeIDs(ctx context.Context) ([]string, error) {
	prefix := s.volumeKey("")
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	s.metrics.observe("get", start)
	if err != nil {
		return nil, fmt.Errorf("%w: list volumes: %w", ErrUnavailable, err)
	}
	ids := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		ids = append(ids, strings.TrimPrefix(string(kv.Key), prefix))
	}
	return ids, nil
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

// appliedRev returns the revision of volume id's definition this host
// applied, and whether it applied one.
func (s *Session) appliedRev(id string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev, ok := s.applied[id]
	return rev, ok
}
