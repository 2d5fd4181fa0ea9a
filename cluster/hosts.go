package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Host statuses.
const (
	// StatusUp: the host's lease is alive.
	StatusUp = "up"
	// StatusDown: the host's lease expired or was revoked; its claims
	// stay until they are released.
	StatusDown = "down"
)

// Host is one agent of the cluster as etcd records it.
type Host struct {
	ID string
	// Status is StatusUp or StatusDown.
	Status string
	// StartedAt is when the host last joined; LastSeen when it last
	// renewed its lease.
	StartedAt, LastSeen time.Time
	// Claims is how many claims the host holds.
	Claims int
}

// Hosts returns every host that ever joined the cluster, by ID.
func (s *Session) Hosts(ctx context.Context) ([]Host, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	start := time.Now()
	// One transaction: the host records and the liveness keys of one
	// revision.
	resp, err := s.cli.Txn(rctx).Then(
		clientv3.OpGet(s.key("hosts")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(s.key("alive")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return nil, fmt.Errorf("%w: list hosts: %w", ErrUnavailable, err)
	}
	alive := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		alive[strings.TrimPrefix(string(kv.Key), s.key("alive")+"/")] = true
	}
	claims, err := s.AllClaims(ctx)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, cs := range claims {
		for _, c := range cs {
			count[c.Host]++
		}
	}
	var out []Host
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		var rec hostRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			continue
		}
		id := strings.TrimPrefix(string(kv.Key), s.key("hosts")+"/")
		h := Host{ID: id, Status: StatusDown, StartedAt: rec.StartedAt, LastSeen: rec.LastSeen, Claims: count[id]}
		if alive[id] {
			h.Status = StatusUp
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// refreshHosts sets csiactor_cluster_hosts from etcd. Every host does so
// at every renewal, so it asks for counts only: the number of host
// records and of liveness keys, in one transaction (not Hosts, whose
// records, and every claim to count them by host, would make each
// renewal's answer grow with the fleet, and the fleet's traffic with its
// square).
func (s *Session) refreshHosts() {
	rctx, cancel := s.reqCtx(s.ctx)
	defer cancel()
	start := time.Now()
	resp, err := s.cli.Txn(rctx).Then(
		clientv3.OpGet(s.key("hosts")+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(s.key("alive")+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	s.metrics.observe("txn", start)
	if err != nil {
		return
	}
	hosts := resp.Responses[0].GetResponseRange().GetCount()
	up := resp.Responses[1].GetResponseRange().GetCount()
	s.metrics.hosts.WithLabelValues(StatusUp).Set(float64(up))
	s.metrics.hosts.WithLabelValues(StatusDown).Set(float64(max(0, hosts-up)))
}
