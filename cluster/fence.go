package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrHostUp is returned by HostClaims and Fence for a host whose lease is
// alive: only a down host can be fenced.
var ErrHostUp = errors.New("host is up")

// ErrUnknownHost is returned by HostClaims for a host that never joined.
var ErrUnknownHost = errors.New("unknown host")

func (s *Session) fencedKey(host, volume, alloc string) string {
	return s.key("fenced", host, volume, alloc)
}

// HostClaims returns the claims host holds, by volume, checking that the
// host joined once and is down now (ErrUnknownHost, ErrHostUp).
func (s *Session) HostClaims(ctx context.Context, host string) (map[string][]HostClaim, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Txn(rctx).Then(
		clientv3.OpGet(s.key("hosts", host), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.aliveKey(host), clientv3.WithKeysOnly()),
	).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return nil, fmt.Errorf("%w: look up host %q: %w", ErrUnavailable, host, err)
	}
	switch {
	case len(resp.Responses[0].GetResponseRange().GetKvs()) == 0:
		return nil, fmt.Errorf("%w: %q never joined the cluster", ErrUnknownHost, host)
	case len(resp.Responses[1].GetResponseRange().GetKvs()) > 0:
		return nil, fmt.Errorf("%w: %q renews its lease; only a down host can be fenced", ErrHostUp, host)
	}
	all, err := s.AllClaims(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]HostClaim{}
	for vol, cs := range all {
		for _, c := range cs {
			if c.Host == host {
				out[vol] = append(out[vol], c)
			}
		}
	}
	return out, nil
}

// Fence takes the claims of allocs that host holds on volume away from
// it: in one transaction, which requires host to be down still, they are
// removed from the volume's claims and recorded as fenced for host, so the
// host releases them locally when it is back (see Fenced). Claims already
// gone are skipped. Run ControllerUnpublishVolume for host's node ID
// first: a host that is down for etcd may still be up for its storage.
func (s *Session) Fence(ctx context.Context, host, volume string, allocs []string) error {
	for range maxCAS {
		d, rev, err := s.readClaims(ctx, volume)
		if err != nil {
			return err
		}
		key := s.claimsKey(volume)
		var ops []clientv3.Op
		for _, alloc := range allocs {
			i := d.find(host, alloc)
			if i < 0 {
				continue
			}
			rec, _ := json.Marshal(d.Claims[i])
			ops = append(ops, clientv3.OpPut(s.fencedKey(host, volume, alloc), string(rec)))
			d.Claims = append(d.Claims[:i], d.Claims[i+1:]...)
		}
		if len(ops) == 0 {
			return nil
		}
		if len(d.Claims) == 0 {
			ops = append(ops, clientv3.OpDelete(key))
		} else {
			data, err := json.Marshal(d)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(key, string(data)))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(
			clientv3.Compare(clientv3.ModRevision(key), "=", rev),
			clientv3.Compare(clientv3.CreateRevision(s.aliveKey(host)), "=", 0),
		).Then(ops...).Else(clientv3.OpGet(s.aliveKey(host), clientv3.WithKeysOnly())).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return fmt.Errorf("%w: fence host %q on volume %q: %w", ErrUnavailable, host, volume, err)
		}
		if resp.Succeeded {
			return nil
		}
		if len(resp.Responses[0].GetResponseRange().GetKvs()) > 0 {
			return fmt.Errorf("%w: %q came back while it was being fenced", ErrHostUp, host)
		}
	}
	return fmt.Errorf("%w: the claims of volume %q kept changing", ErrUnavailable, volume)
}

// FencedClaim is a claim of this host that another host fenced.
type FencedClaim struct {
	Volume string
	HostClaim
}

// Fenced returns this host's claims that were fenced while it was down.
func (s *Session) Fenced(ctx context.Context) ([]FencedClaim, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	prefix := s.key("fenced", s.cfg.NodeID) + "/"
	start := time.Now()
	resp, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix())
	s.metrics.observe("get", start)
	if err != nil {
		return nil, fmt.Errorf("%w: list fenced claims: %w", ErrUnavailable, err)
	}
	var out []FencedClaim
	for _, kv := range resp.Kvs {
		vol, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		var c HostClaim
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			continue
		}
		out = append(out, FencedClaim{Volume: vol, HostClaim: c})
	}
	return out, nil
}

// ClearFenced forgets the fence record of this host's claim of alloc on
// volume, once the host has released it.
func (s *Session) ClearFenced(ctx context.Context, volume, alloc string) error {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	_, err := s.cli.Delete(rctx, s.fencedKey(s.cfg.NodeID, volume, alloc))
	s.metrics.observe("delete", start)
	if err != nil {
		return fmt.Errorf("%w: clear fenced claim: %w", ErrUnavailable, err)
	}
	return nil
}

// Rejoined receives a value each time this host's lease expired and a
// new one was granted: claims may have been fenced meanwhile.
func (s *Session) Rejoined() <-chan struct{} { return s.rejoined }

// VolumeDef returns volume id's definition as PutVolume (or UpdateVolume)
// recorded it, or nil.
func (s *Session) VolumeDef(ctx context.Context, id string) ([]byte, error) {
	def, _, err := s.VolumeDefRev(ctx, id)
	return def, err
}

// VolumeDefRev returns volume id's definition and its mod revision (for
// UpdateVolume), or nil and 0.
func (s *Session) VolumeDefRev(ctx context.Context, id string) ([]byte, int64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.volumeKey(id))
	s.metrics.observe("get", start)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: read volume %q: %w", ErrUnavailable, id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}
