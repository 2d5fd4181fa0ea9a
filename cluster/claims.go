package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/csiactor/csiactor/persistence"
)

// maxCAS bounds the compare-and-swap rounds of one Admit; each lost round
// means another host changed the volume's claims meanwhile.
const maxCAS = 64

// HostClaim is a claim as the cluster records it: which host and
// allocation hold it, in which mode.
type HostClaim struct {
	Host           string    `json:"host"`
	Alloc          string    `json:"alloc"`
	Mode           string    `json:"mode"`
	AccessMode     string    `json:"access_mode"`
	AttachmentMode string    `json:"attachment_mode"`
	Since          time.Time `json:"since"`
	// CSINodeID is the node plugin's ID for the host, and
	// ControllerRequired says the claim went through
	// ControllerPublishVolume: a fence of the host unpublishes it there.
	CSINodeID          string `json:"csi_node_id,omitempty"`
	ControllerRequired bool   `json:"controller_required,omitempty"`
	// Nonce is new at every admission, so that a free meant for an
	// earlier claim of the same allocation never removes a later one.
	Nonce string `json:"nonce"`
}

// claimsDoc is the value of <prefix>/claims/<volume>.
type claimsDoc struct {
	Claims []HostClaim `json:"claims"`
}

func (d *claimsDoc) find(host, alloc string) int {
	for i, c := range d.Claims {
		if c.Host == host && c.Alloc == alloc {
			return i
		}
	}
	return -1
}

// held returns d's claims as persistence claims with NodeID set to their
// host, for the caller's access-mode check.
func (d *claimsDoc) held() []persistence.Claim {
	out := make([]persistence.Claim, 0, len(d.Claims))
	for _, c := range d.Claims {
		out = append(out, persistence.Claim{NodeID: c.Host, Alloc: c.Alloc, Mode: c.Mode,
			AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode, CreatedAt: c.Since})
	}
	return out
}

func (s *Session) claimsKey(volume string) string { return s.key("claims", volume) }

// readClaims reads a volume's claims document and its mod revision (0
// when there is none).
func (s *Session) readClaims(ctx context.Context, volume string) (claimsDoc, int64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Get(rctx, s.claimsKey(volume))
	s.metrics.observe("get", start)
	if err != nil {
		return claimsDoc{}, 0, fmt.Errorf("%w: read the claims of volume %q: %w", ErrUnavailable, volume, err)
	}
	var d claimsDoc
	if len(resp.Kvs) == 0 {
		return d, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &d); err != nil {
		return claimsDoc{}, 0, fmt.Errorf("decode the claims of volume %q: %w", volume, err)
	}
	return d, resp.Kvs[0].ModRevision, nil
}

// Admit records c (Alloc, Mode, AccessMode, AttachmentMode) as this host's
// claim on volume. fits is called with the claims every host holds on the
// volume (NodeID set to the host) and decides by the access-mode table;
// its error is returned as it is. The claim is written by one transaction
// that compares the claims key's mod revision with what fits saw and this
// host's liveness key's lease; a lost race reads again and asks fits
// again. A claim this host already holds for c.Alloc is admitted again
// without a write.
//
// It fails with ErrUnavailable when etcd does not answer or this host's
// lease was not renewed in time (see AdmitDeadline), and with a
// *StaleError when the volume's definition changed since this host
// applied it (see Applied).
func (s *Session) Admit(ctx context.Context, volume string, c persistence.Claim, fits func(held []persistence.Claim) error) error {
	ref := claimRef{volume, c.Alloc}
	s.mu.Lock()
	_, refreed := s.frees[ref]
	delete(s.frees, ref) // a claim of the alloc again: the free is void
	s.mu.Unlock()
	for range maxCAS {
		lease, err := s.admitting()
		if err != nil {
			return err
		}
		// Taken before the read: a free that completes after it is not in
		// what the read returns, one that completes later is in this.
		freeing := s.pendingFrees(volume)
		d, rev, err := s.readClaims(ctx, volume)
		if err != nil {
			return err
		}
		s.mu.Lock()
		current := s.nonces[ref]
		s.mu.Unlock()
		i := d.find(s.cfg.NodeID, c.Alloc)
		if i >= 0 && !refreed && current != "" && d.Claims[i].Nonce == current {
			return nil // admitted before, and no free of it is under way
		}
		if i >= 0 {
			d.Claims = append(d.Claims[:i], d.Claims[i+1:]...)
		}
		s.dropFreed(freeing, &d)
		if err := fits(d.held()); err != nil {
			return err
		}
		nonce := strconv.FormatUint(rand.Uint64(), 36)
		d.Claims = append(d.Claims, HostClaim{Host: s.cfg.NodeID, Alloc: c.Alloc, Mode: c.Mode,
			AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode, Since: time.Now().UTC(), Nonce: nonce,
			CSINodeID: c.NodeID, ControllerRequired: c.ControllerRequired})
		data, err := json.Marshal(d)
		if err != nil {
			return err
		}
		key, alive := s.claimsKey(volume), s.aliveKey(s.cfg.NodeID)
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(key), "=", rev),
			clientv3.Compare(clientv3.LeaseValue(alive), "=", lease),
		}
		// The definition this host's record has must still be etcd's.
		defRev, applied := s.appliedRev(volume)
		if applied {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.volumeKey(volume)), "=", defRev))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(cmps...).Then(clientv3.OpPut(key, string(data))).
			Else(clientv3.OpGet(alive), clientv3.OpGet(s.volumeKey(volume), clientv3.WithKeysOnly())).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			// etcd may have applied the transaction though its answer
			// was lost (a timeout in a partition): the caller records no
			// claim, so free what it may have written, by its nonce, or
			// it would hold the volume for this host until a restart.
			s.mu.Lock()
			s.frees[ref] = nonce
			s.mu.Unlock()
			s.kickFree()
			return fmt.Errorf("%w: admit the claim of alloc %q on volume %q: %w", ErrUnavailable, c.Alloc, volume, err)
		}
		if resp.Succeeded {
			s.mu.Lock()
			s.nonces[ref] = nonce
			s.mu.Unlock()
			return nil
		}
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != lease {
			return fmt.Errorf("%w: this host's etcd lease is gone; new claims are refused until it is renewed", ErrUnavailable)
		}
		if kvs := resp.Responses[1].GetResponseRange().GetKvs(); applied && (len(kvs) == 0 && defRev != 0 || len(kvs) > 0 && kvs[0].ModRevision != defRev) {
			return &StaleError{Volume: volume, Applied: defRev}
		}
	}
	return fmt.Errorf("%w: the claims of volume %q kept changing; try again", ErrUnavailable, volume)
}

// pendingFrees returns the allocs of this host's claims on volume that
// were freed here and wait for the free loop, with their nonces.
func (s *Session) pendingFrees(volume string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[string]string
	for r, nonce := range s.frees {
		if r.volume == volume {
			if out == nil {
				out = map[string]string{}
			}
			out[r.alloc] = nonce
		}
	}
	return out
}

// dropFreed removes from d this host's claims in freeing (see
// pendingFrees): they hold no place any more, and a claim right after a
// release must not be refused for them. The write that follows removes
// them from etcd too.
func (s *Session) dropFreed(freeing map[string]string, d *claimsDoc) {
	if len(freeing) == 0 {
		return
	}
	kept := d.Claims[:0]
	for _, c := range d.Claims {
		if nonce, ok := freeing[c.Alloc]; ok && c.Host == s.cfg.NodeID && (nonce == "" || nonce == c.Nonce) {
			continue
		}
		kept = append(kept, c)
	}
	d.Claims = kept
}

// Free removes this host's claim of alloc on volume from etcd. It does not
// wait: a background goroutine retries until etcd has it, or until Close
// (then the next Prune does it).
func (s *Session) Free(volume, alloc string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	ref := claimRef{volume, alloc}
	s.frees[ref] = s.nonces[ref]
	delete(s.nonces, ref)
	s.mu.Unlock()
	s.kickFree()
}

// kickFree wakes the free loop.
func (s *Session) kickFree() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// freeLoop removes the claims Free was given, retrying failures with a
// backoff from 100 ms to 5 s.
func (s *Session) freeLoop() {
	defer s.wg.Done()
	delay := 100 * time.Millisecond
	var retry <-chan time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		case <-retry:
		}
		retry = nil
		s.mu.Lock()
		refs := make(map[claimRef]string, len(s.frees))
		for r, nonce := range s.frees {
			refs[r] = nonce
		}
		s.mu.Unlock()
		failed := false
		for r, nonce := range refs {
			if err := s.remove(s.ctx, r, nonce); err != nil {
				failed = true
				if s.ctx.Err() == nil {
					s.log.WithError(err).WithFields(map[string]any{"volume": r.volume, "alloc": r.alloc}).
						Warn("cannot remove a freed claim from etcd; retrying")
				}
				continue
			}
			s.mu.Lock()
			if n, ok := s.frees[r]; ok && n == nonce {
				delete(s.frees, r)
			}
			s.mu.Unlock()
		}
		if failed {
			retry = time.After(delay)
			delay = min(2*delay, 5*time.Second)
		} else {
			delay = 100 * time.Millisecond
		}
	}
}

// remove deletes this host's claim r with nonce (any nonce when it is
// empty) from its volume's claims document, and the document when it is
// left empty.
func (s *Session) remove(ctx context.Context, r claimRef, nonce string) error {
	for range maxCAS {
		d, rev, err := s.readClaims(ctx, r.volume)
		if err != nil {
			return err
		}
		i := d.find(s.cfg.NodeID, r.alloc)
		if i < 0 || (nonce != "" && d.Claims[i].Nonce != nonce) {
			return nil
		}
		d.Claims = append(d.Claims[:i], d.Claims[i+1:]...)
		key := s.claimsKey(r.volume)
		op := clientv3.OpDelete(key)
		if len(d.Claims) > 0 {
			data, err := json.Marshal(d)
			if err != nil {
				return err
			}
			op = clientv3.OpPut(key, string(data))
		}
		rctx, cancel := s.reqCtx(ctx)
		start := time.Now()
		resp, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(op).Commit()
		cancel()
		s.metrics.observe("txn", start)
		if err != nil {
			return fmt.Errorf("%w: free the claim of alloc %q on volume %q: %w", ErrUnavailable, r.alloc, r.volume, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%w: the claims of volume %q kept changing", ErrUnavailable, r.volume)
}

// Claims returns the claims every host holds on volume, by host and
// allocation.
func (s *Session) Claims(ctx context.Context, volume string) ([]HostClaim, error) {
	d, _, err := s.readClaims(ctx, volume)
	if err != nil {
		return nil, err
	}
	sortClaims(d.Claims)
	return d.Claims, nil
}

func sortClaims(cs []HostClaim) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Host != cs[j].Host {
			return cs[i].Host < cs[j].Host
		}
		return cs[i].Alloc < cs[j].Alloc
	})
}

// AllClaims returns the claims of every host on every volume that has
// one, by volume ID, read in one request.
func (s *Session) AllClaims(ctx context.Context) (map[string][]HostClaim, error) {
	prefix := s.claimsKey("")
	return s.claimsRange(ctx, prefix, clientv3.GetPrefixRangeEnd(prefix))
}

// claimsRange returns the claims documents of the keys from key to end
// (excluded), by volume ID.
func (s *Session) claimsRange(ctx context.Context, key, end string) (map[string][]HostClaim, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	prefix := s.claimsKey("")
	start := time.Now()
	resp, err := s.cli.Get(rctx, key, clientv3.WithRange(end))
	s.metrics.observe("get", start)
	if err != nil {
		return nil, fmt.Errorf("%w: list claims: %w", ErrUnavailable, err)
	}
	out := make(map[string][]HostClaim, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var d claimsDoc
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			s.log.WithError(err).WithField("key", string(kv.Key)).Warn("cannot decode a claims document; skipped")
			continue
		}
		sortClaims(d.Claims)
		out[strings.TrimPrefix(string(kv.Key), prefix)] = d.Claims
	}
	return out, nil
}

// Prune frees every claim etcd holds for this host that has no claim or
// past claim on the host (has says which do): a claim admitted just
// before a crash that kept it from being reserved, or one freed while etcd
// could not be told. Call it at start, before new claims are admitted. It
// returns how many it freed.
func (s *Session) Prune(ctx context.Context, has func(volume, alloc string) bool) (int, error) {
	all, err := s.AllClaims(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for vol, cs := range all {
		for _, c := range cs {
			if c.Host != s.cfg.NodeID {
				continue
			}
			if has(vol, c.Alloc) {
				s.mu.Lock()
				s.nonces[claimRef{vol, c.Alloc}] = c.Nonce
				s.mu.Unlock()
				continue
			}
			if err := s.remove(ctx, claimRef{vol, c.Alloc}, c.Nonce); err != nil {
				return n, err
			}
			s.log.WithFields(map[string]any{"volume": vol, "alloc": c.Alloc}).
				Info("freed a claim etcd held for this host that the host no longer has")
			n++
		}
	}
	return n, nil
}
