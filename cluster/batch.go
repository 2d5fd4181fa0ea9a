package cluster

import (
	"bytes"
	"context"
	"fmt"
	"time"

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
	out := make([][]byte, len(ids))
	for lo := 0; lo < len(ids); lo += MaxTxnOps {
		page := ids[lo:min(lo+MaxTxnOps, len(ids))]
		ops := make([]clientv3.Op, len(page))
		for i, id := range page {
			ops[i] = clientv3.OpGet(s.volumeKey(id))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return nil, fmt.Errorf("%w: read %d volume definitions: %w", ErrUnavailable, len(page), err)
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				out[lo+i] = kvs[0].Value
			}
		}
	}
	return out, nil
}

// PutVolumes records the definitions defs of the volumes ids, new to the
// cluster, as PutVolume records one, and returns one error per volume in
// ids' order (nil: recorded, or recorded already with the same
// definition; ErrConflict: the cluster has another definition). It writes
// MaxTxnOps definitions per transaction, each creating its keys only if
// none of them exists; a volume that exists leaves its page, which is
// written again without it. ids must not repeat.
func (s *Session) PutVolumes(ctx context.Context, ids []string, defs [][]byte) []error {
	errs := make([]error, len(ids))
	for lo := 0; lo < len(ids); lo += MaxTxnOps {
		hi := min(lo+MaxTxnOps, len(ids))
		page := make([]int, 0, hi-lo)
		for i := lo; i < hi; i++ {
			page = append(page, i)
		}
		s.putPage(ctx, ids, defs, page, errs)
	}
	return errs
}

// putPage writes the definitions at the indexes page in one transaction
// (see PutVolumes), setting errs of each.
func (s *Session) putPage(ctx context.Context, ids []string, defs [][]byte, page []int, errs []error) {
	for round := 0; len(page) > 0; round++ {
		if round == maxPutRounds {
			for _, i := range page {
				errs[i] = fmt.Errorf("%w: register volume %q: other hosts kept registering volumes of the same page; try again", ErrUnavailable, ids[i])
			}
			return
		}
		cmps := make([]clientv3.Cmp, len(page))
		puts := make([]clientv3.Op, len(page))
		gets := make([]clientv3.Op, len(page))
		for k, i := range page {
			key := s.volumeKey(ids[i])
			cmps[k] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
			puts[k] = clientv3.OpPut(key, string(defs[i]))
			gets[k] = clientv3.OpGet(key)
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(cmps...).Then(puts...).Else(gets...).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			for _, i := range page {
				errs[i] = fmt.Errorf("%w: register volume %q: %w", ErrUnavailable, ids[i], err)
			}
			return
		}
		applied := make(map[string]int64, len(page))
		if resp.Succeeded {
			for _, i := range page {
				applied[ids[i]] = resp.Header.Revision
			}
			s.appliedAll(applied)
			return
		}
		// Some exist: settle those, and write the rest again.
		rest := page[:0]
		for k, i := range page {
			kvs := resp.Responses[k].GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0:
				rest = append(rest, i)
			case bytes.Equal(kvs[0].Value, defs[i]):
				applied[ids[i]] = kvs[0].ModRevision
			default:
				errs[i] = fmt.Errorf("%w: volume %q is registered in the cluster with a different definition", ErrConflict, ids[i])
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
