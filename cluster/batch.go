package cluster

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxTxnOps is the most operations one etcd transaction of a bulk
// registration holds (compares, and operations of either branch): etcd's
// own limit, --max-txn-ops, is 128 unless raised.
const MaxTxnOps = 128

// maxPutRounds bounds the rounds of one page of PutVolumes; each lost
// round means another host registered one of its volumes meanwhile, and
// that volume leaves the page.
const maxPutRounds = 4

// VolumeDefs returns the definitions etcd holds of the volumes ids, in
// ids' order (nil for a volume it does not have), reading MaxTxnOps keys
// per transaction.
func (s *Session) VolumeDefs(ctx context.Context, ids []string) ([][]byte, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.volumeKey(id)
	}
	kvs, err := s.readKeys(ctx, keys, "volume definitions")
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(ids))
	for i, kv := range kvs {
		if kv != nil {
			out[i] = kv.Value
		}
	}
	return out, nil
}

// ExternalOwners is ExternalOwner for many plugin volumes of plugin at
// once: the ID each of externalIDs is registered as in the cluster, in
// externalIDs' order (empty for none), in two reads of MaxTxnOps keys per
// transaction (the records, then whether their volumes are still there).
func (s *Session) ExternalOwners(ctx context.Context, plugin string, externalIDs []string) ([]string, error) {
	keys := make([]string, len(externalIDs))
	for i, x := range externalIDs {
		keys[i] = s.externalKey(plugin, x)
	}
	recs, err := s.readKeys(ctx, keys, "plugin volume records")
	if err != nil {
		return nil, err
	}
	owners := make([]string, len(externalIDs))
	for i, kv := range recs {
		if kv != nil {
			owners[i] = string(kv.Value)
			keys[i] = s.volumeKey(owners[i])
		} else {
			keys[i] = s.volumeKey("") // never a volume: read as none
		}
	}
	defs, err := s.readKeys(ctx, keys, "volume definitions", clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	for i, kv := range defs {
		if kv == nil {
			owners[i] = "" // deregistered since: the record is free
		}
	}
	return owners, nil
}

// readKeys reads keys, MaxTxnOps per transaction, and returns what etcd
// holds of each in keys' order (nil for a key it does not have); what
// names them in an error.
func (s *Session) readKeys(ctx context.Context, keys []string, what string, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, error) {
	out := make([]*mvccpb.KeyValue, len(keys))
	for lo := 0; lo < len(keys); lo += MaxTxnOps {
		page := keys[lo:min(lo+MaxTxnOps, len(keys))]
		ops := make([]clientv3.Op, len(page))
		for i, k := range page {
			ops[i] = clientv3.OpGet(k, opts...)
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return nil, fmt.Errorf("%w: read %d %s: %w", ErrUnavailable, len(page), what, err)
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				out[lo+i] = kvs[0]
			}
		}
	}
	return out, nil
}

// NewVolume is one volume of PutVolumes: its ID, its definition, and the
// plugin volume it is registered for (ExternalID empty: none), which gets
// the record PutVolumeOf writes.
type NewVolume struct {
	ID, Plugin, ExternalID string
	Def                    []byte
}

// PutVolumes records the definitions of vols, new to the cluster, as
// PutVolumeOf records one, and returns one error per volume in vols'
// order (nil: recorded, or recorded already with the same definition;
// ErrConflict: the cluster has another definition, or its plugin volume
// is registered as another volume). It writes MaxTxnOps/2 volumes per
// transaction (a definition and its plugin volume's record each), each
// creating its keys only if none of them exists; a volume whose key
// exists leaves its page, which is written again without it, and one
// whose plugin volume has a record (of a volume deregistered since, or
// another) is settled alone by PutVolumeOf. IDs must not repeat.
func (s *Session) PutVolumes(ctx context.Context, vols []NewVolume) []error {
	errs := make([]error, len(vols))
	const per = MaxTxnOps / 2
	for lo := 0; lo < len(vols); lo += per {
		hi := min(lo+per, len(vols))
		page := make([]int, 0, hi-lo)
		for i := lo; i < hi; i++ {
			page = append(page, i)
		}
		s.putPage(ctx, vols, page, errs)
	}
	return errs
}

// putPage writes the volumes at the indexes page in one transaction (see
// PutVolumes), setting errs of each.
func (s *Session) putPage(ctx context.Context, vols []NewVolume, page []int, errs []error) {
	for round := 0; len(page) > 0; round++ {
		if round == maxPutRounds {
			for _, i := range page {
				errs[i] = fmt.Errorf("%w: register volume %q: other hosts kept registering volumes of the same page; try again", ErrUnavailable, vols[i].ID)
			}
			return
		}
		var cmps []clientv3.Cmp
		var puts, gets []clientv3.Op
		for _, i := range page {
			v := vols[i]
			key := s.volumeKey(v.ID)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			puts = append(puts, clientv3.OpPut(key, string(v.Def)))
			gets = append(gets, clientv3.OpGet(key))
			if v.ExternalID != "" {
				xk := s.externalKey(v.Plugin, v.ExternalID)
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(xk), "=", 0))
				puts = append(puts, clientv3.OpPut(xk, v.ID))
				gets = append(gets, clientv3.OpGet(xk, clientv3.WithCountOnly()))
			}
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(cmps...).Then(puts...).Else(gets...).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			for _, i := range page {
				errs[i] = fmt.Errorf("%w: register volume %q: %w", ErrUnavailable, vols[i].ID, err)
			}
			return
		}
		applied := make(map[string]int64, len(page))
		if resp.Succeeded {
			for _, i := range page {
				applied[vols[i].ID] = resp.Header.Revision
			}
			s.appliedAll(applied)
			return
		}
		// Some exist: settle those, and write the rest again.
		rest := page[:0]
		k := 0
		for _, i := range page {
			v := vols[i]
			kvs := resp.Responses[k].GetResponseRange().GetKvs()
			k++
			recorded := false
			if v.ExternalID != "" {
				recorded = resp.Responses[k].GetResponseRange().GetCount() > 0
				k++
			}
			switch {
			case len(kvs) > 0 && bytes.Equal(kvs[0].Value, v.Def):
				applied[v.ID] = kvs[0].ModRevision
			case len(kvs) > 0:
				errs[i] = fmt.Errorf("%w: volume %q is registered in the cluster with a different definition", ErrConflict, v.ID)
			case recorded:
				errs[i] = s.PutVolumeOf(ctx, v.ID, v.Plugin, v.ExternalID, v.Def)
			default:
				rest = append(rest, i)
			}
		}
		s.appliedAll(applied)
		page = rest
	}
}

// appliedAll is Applied of every volume of revs, at its revision.
func (s *Session) appliedAll(revs map[string]int64) {
	if len(revs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, rev := range revs {
		s.applied[id] = rev
	}
	close(s.appliedCh)
	s.appliedCh = make(chan struct{})
}
