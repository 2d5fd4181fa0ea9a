package cluster

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
)

// Defaults of a Config's zero fields.
const (
	DefaultLeaseTTL    = 10 * time.Second
	DefaultPrefix      = "/csiactor/v1"
	DefaultDialTimeout = 5 * time.Second
	// DefaultAnswerRetention is Config.AnswerRetention's default: a
	// requester that restarts within a day still finds its answer.
	DefaultAnswerRetention = 24 * time.Hour
)

// Config configures a Session. Zero fields mean their defaults.
type Config struct {
	// NodeID names this host in the cluster. Required.
	NodeID string
	// Endpoints are the etcd client URLs. Required.
	Endpoints []string
	// TLS, when set, is used to dial the endpoints.
	TLS *tls.Config
	// Username and Password authenticate to etcd when Username is set.
	Username, Password string
	// DialTimeout bounds the first contact with etcd, and every request.
	// Zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// LeaseTTL is the TTL of this host's lease. etcd counts it in whole
	// seconds and may raise it to its minimum; the TTL it grants is the
	// one used. Zero means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Prefix is the key prefix of everything the session writes. Zero
	// means DefaultPrefix.
	Prefix string
	// AnswerRetention is how long the answer to a one-shot controller
	// request (anything but a claim step) stays in etcd when its
	// requester never reads it (it gave up, or its host is gone): the
	// plugin's controller leader removes older ones. Zero means
	// DefaultAnswerRetention.
	AnswerRetention time.Duration
	// Logger receives the session's logs; nil discards them.
	Logger *logrus.Entry
	// Registerer receives csiactor_cluster_hosts,
	// csiactor_cluster_etcd_request_seconds and
	// csiactor_cluster_lease_renewals_total; nil registers nothing.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.AnswerRetention == 0 {
		c.AnswerRetention = DefaultAnswerRetention
	}
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	return c
}

// Validate reports the first field that cannot be used, naming it and
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.NodeID == "":
		return fmt.Errorf("%w: node_id is empty", ErrInvalidConfig)
	case strings.ContainsAny(c.NodeID, "/\x00"):
		return fmt.Errorf("%w: node_id %q contains '/' or NUL", ErrInvalidConfig, c.NodeID)
	case len(c.Endpoints) == 0:
		return fmt.Errorf("%w: etcd.endpoints is empty", ErrInvalidConfig)
	case c.DialTimeout < 0:
		return fmt.Errorf("%w: etcd.dial_timeout %s is negative", ErrInvalidConfig, c.DialTimeout)
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("%w: lease_ttl %s is shorter than 1s", ErrInvalidConfig, c.LeaseTTL)
	case !strings.HasPrefix(c.Prefix, "/"):
		return fmt.Errorf("%w: prefix %q does not start with '/'", ErrInvalidConfig, c.Prefix)
	}
	for i, e := range c.Endpoints {
		if e == "" {
			return fmt.Errorf("%w: etcd.endpoints[%d] is empty", ErrInvalidConfig, i)
		}
	}
	return nil
}
