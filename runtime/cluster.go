package runtime

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/internal/seal"
	"github.com/csiactor/csiactor/persistence"
)

// Defaults of a ClusterConfig's zero fields.
const (
	DefaultLeaseTTL        = cluster.DefaultLeaseTTL
	DefaultClusterPrefix   = cluster.DefaultPrefix
	DefaultEtcdDialTimeout = cluster.DefaultDialTimeout
	// MinLeaseTTL is the shortest cluster.lease_ttl.
	MinLeaseTTL = 2 * time.Second
)

// ClusterConfig turns on cluster mode: the agents that share one etcd
// share their volumes and claims, and each claim is admitted across all
// of their hosts. A nil *ClusterConfig (no cluster section) is the default:
// the agent keeps everything in its bbolt store only.
type ClusterConfig struct {
	// NodeID names this host in the cluster. Empty means the host name.
	NodeID string `yaml:"node_id"`
	// Etcd is how the agent reaches etcd. Endpoints are required.
	Etcd EtcdConfig `yaml:"etcd"`
	// LeaseTTL is the TTL of this host's lease, in whole seconds, at
	// least MinLeaseTTL. The agent stops admitting new claims three
	// quarters of it after its last acknowledged renewal. Zero means
	// DefaultLeaseTTL.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Prefix is the etcd key prefix of the cluster. Zero means
	// DefaultClusterPrefix.
	Prefix string `yaml:"prefix"`
	// VolumeCache is how many volume definitions the agent keeps in
	// memory (and in its store) beyond those it has claims on: the most
	// recently used. The others stay in etcd only and are read from there
	// when asked for. Zero means DefaultVolumeCache.
	VolumeCache int `yaml:"volume_cache"`
	// FenceAfter, when set, fences a host automatically once it has been
	// down this long (as the plugin's controller leader saw it): the
	// controller leader of each plugin unpublishes the host's claims on
	// the plugin's volumes and takes them from it, so that other hosts
	// can claim them. It must be longer than LeaseTTL plus the self-fence
	// margin (a quarter of LeaseTTL): a host that lost etcd stops
	// admitting claims on its own by then. Zero (off) is the default.
	FenceAfter time.Duration `yaml:"fence_after"`
}

// SelfFenceMargin is how long before its lease can expire on the server
// an agent that cannot renew it stops admitting new claims: a quarter of
// the TTL.
func SelfFenceMargin(leaseTTL time.Duration) time.Duration { return leaseTTL / 4 }

// EtcdConfig is how an agent reaches etcd.
type EtcdConfig struct {
	// Endpoints are the client URLs of the etcd members, like
	// "https://10.0.0.1:2379".
	Endpoints []string `yaml:"endpoints"`
	// TLS, when any field is set, dials the endpoints with TLS.
	TLS EtcdTLSConfig `yaml:"tls"`
	// Username, with PasswordFile, authenticates to etcd.
	Username string `yaml:"username"`
	// PasswordFile holds the password of Username (trailing newlines
	// are dropped). An absolute path.
	PasswordFile string `yaml:"password_file"`
	// DialTimeout bounds the first contact with etcd and every request.
	// Zero means DefaultEtcdDialTimeout.
	DialTimeout time.Duration `yaml:"dial_timeout"`
}

// EtcdTLSConfig holds the PEM files of an etcd TLS connection; each is an
// absolute path.
type EtcdTLSConfig struct {
	// CA verifies the members' certificates; empty means the system's.
	CA string `yaml:"ca"`
	// Cert and Key are this agent's client certificate and key; both or
	// neither.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// withDefaults returns a copy of c with zero values filled in (the node ID
// from the host name).
func (c *ClusterConfig) withDefaults() *ClusterConfig {
	if c == nil {
		return nil
	}
	d := *c
	d.Etcd.Endpoints = append([]string(nil), c.Etcd.Endpoints...)
	if d.NodeID == "" {
		if h, err := os.Hostname(); err == nil {
			d.NodeID = h
		}
	}
	setDefault(&d.LeaseTTL, DefaultLeaseTTL)
	setDefault(&d.Prefix, DefaultClusterPrefix)
	setDefault(&d.Etcd.DialTimeout, DefaultEtcdDialTimeout)
	setDefault(&d.VolumeCache, DefaultVolumeCache)
	return &d
}

// Validate checks c with its defaults; the error is a *FieldError naming
// the key under "cluster".
func (c *ClusterConfig) Validate() error {
	if c == nil {
		return nil
	}
	c = c.withDefaults()
	if c.NodeID == "" {
		return fieldErr("cluster.node_id", "empty, and the host name is unknown; set it")
	}
	if err := ValidateID("cluster.node_id", c.NodeID); err != nil {
		return err
	}
	if len(c.Etcd.Endpoints) == 0 {
		return fieldErr("cluster.etcd.endpoints", "give at least one etcd client URL, like \"https://10.0.0.1:2379\"")
	}
	for i, e := range c.Etcd.Endpoints {
		key := fmt.Sprintf("cluster.etcd.endpoints[%d]", i)
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
			return fieldErr(key, fmt.Sprintf("%q: want a URL like \"https://10.0.0.1:2379\"", e))
		}
	}
	t := c.Etcd.TLS
	for _, f := range []struct{ key, path string }{
		{"cluster.etcd.tls.ca", t.CA}, {"cluster.etcd.tls.cert", t.Cert}, {"cluster.etcd.tls.key", t.Key},
		{"cluster.etcd.password_file", c.Etcd.PasswordFile},
	} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			return fieldErr(f.key, fmt.Sprintf("%q is not an absolute path", f.path))
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return fieldErr("cluster.etcd.tls.cert", "give both cert and key, or neither")
	}
	if (c.Etcd.Username == "") != (c.Etcd.PasswordFile == "") {
		return fieldErr("cluster.etcd.username", "give both username and password_file, or neither")
	}
	if c.Etcd.DialTimeout < 0 {
		return fieldErr("cluster.etcd.dial_timeout", fmt.Sprintf("%s is negative", c.Etcd.DialTimeout))
	}
	if c.LeaseTTL < MinLeaseTTL || c.LeaseTTL%time.Second != 0 {
		return fieldErr("cluster.lease_ttl", fmt.Sprintf("%s: want whole seconds, at least %s", c.LeaseTTL, MinLeaseTTL))
	}
	if !strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") || strings.ContainsRune(c.Prefix, 0) {
		return fieldErr("cluster.prefix", fmt.Sprintf("%q: want a key prefix like \"/csiactor/v1\" (a leading '/', no trailing one)", c.Prefix))
	}
	if c.VolumeCache < 0 {
		return fieldErr("cluster.volume_cache", fmt.Sprintf("%d is negative; want a number of volume definitions, or 0 for the default (%d)", c.VolumeCache, DefaultVolumeCache))
	}
	switch {
	case c.FenceAfter < 0:
		return fieldErr("cluster.fence_after", fmt.Sprintf("%s is negative", c.FenceAfter))
	case c.FenceAfter > 0 && c.FenceAfter <= c.LeaseTTL+SelfFenceMargin(c.LeaseTTL):
		return fieldErr("cluster.fence_after", fmt.Sprintf("%s: want longer than lease_ttl (%s) plus the self-fence margin (%s), or 0 (off)",
			c.FenceAfter, c.LeaseTTL, SelfFenceMargin(c.LeaseTTL)))
	}
	return nil
}

// sessionConfig builds the cluster session's config, reading the TLS and
// password files.
func (c *ClusterConfig) sessionConfig() (cluster.Config, error) {
	sc := cluster.Config{
		NodeID:      c.NodeID,
		Endpoints:   c.Etcd.Endpoints,
		DialTimeout: c.Etcd.DialTimeout,
		LeaseTTL:    c.LeaseTTL,
		Prefix:      c.Prefix,
		Username:    c.Etcd.Username,
	}
	if c.Etcd.PasswordFile != "" {
		b, err := os.ReadFile(c.Etcd.PasswordFile)
		if err != nil {
			return sc, fmt.Errorf("cluster.etcd.password_file: %w", err)
		}
		sc.Password = strings.TrimRight(string(b), "\r\n")
	}
	t := c.Etcd.TLS
	if t != (EtcdTLSConfig{}) {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.CA != "" {
			pem, err := os.ReadFile(t.CA)
			if err != nil {
				return sc, fmt.Errorf("cluster.etcd.tls.ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return sc, fmt.Errorf("cluster.etcd.tls.ca: %s holds no PEM certificate", t.CA)
			}
			tc.RootCAs = pool
		}
		if t.Cert != "" {
			cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
			if err != nil {
				return sc, fmt.Errorf("cluster.etcd.tls.cert: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		sc.TLS = tc
	}
	return sc, nil
}

// clusterVolume is a volume definition as the cluster shares it, secrets
// and mount flags included (the other hosts send them to their plugins).
// It is decoded into a VolumeSpec, and encoded by encode from its wire
// form: VolumeSpec's own MarshalJSON redacts.
type clusterVolume struct {
	ID   string     `json:"id"`
	Spec VolumeSpec `json:"spec"`
	// Created marks a volume created through a plugin; CapacityBytes and
	// AccessibleTopology are what the plugin said of it (Spec.Context
	// holds the volume context it gave too); the capacity grows with an
	// expansion. A created volume shared before definitions carried them
	// lacks Created; see completeShared.
	Created            bool                `json:"created,omitempty"`
	CapacityBytes      int64               `json:"capacity_bytes,omitempty"`
	AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
	// MutableParameters are what ControllerModifyVolume applied on some
	// host, merged; every host merges them into its record.
	MutableParameters map[string]string `json:"mutable_parameters,omitempty"`
}

// clusterRecord names volume id's definition for sealing its secrets.
func clusterRecord(id string) string { return "cluster/volume/" + id }

// encode returns cv as etcd holds it. With keys, its secrets are sealed
// and kept under "sealed_secrets" instead of the spec's "secrets"; the
// sealed values differ at every encoding (a random nonce), so compare
// definitions with sameShared, never by their bytes. Without keys, the
// same definition always encodes to the same bytes.
func (cv clusterVolume) encode(keys *seal.Keyring) ([]byte, error) {
	spec := wireVolumeSpec(cv.Spec)
	var sealed map[string]string
	if keys.Enabled() && len(spec.Secrets) > 0 {
		sealed, spec.Secrets = keys.SealMap(clusterRecord(cv.ID), spec.Secrets), nil
	}
	return json.Marshal(struct {
		ID                 string              `json:"id"`
		Spec               volumeSpecWire      `json:"spec"`
		Created            bool                `json:"created,omitempty"`
		CapacityBytes      int64               `json:"capacity_bytes,omitempty"`
		AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
		SealedSecrets      map[string]string   `json:"sealed_secrets,omitempty"`
		MutableParameters  map[string]string   `json:"mutable_parameters,omitempty"`
	}{cv.ID, spec, cv.Created, cv.CapacityBytes, cv.AccessibleTopology, sealed, cv.MutableParameters})
}

// sameShared reports whether a and b are the same definition, secrets
// compared in clear.
func sameShared(a, b clusterVolume) bool {
	ea, err1 := a.encode(nil)
	eb, err2 := b.encode(nil)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

// volumeSpec is cv as the volume manager's Mirror takes it.
func (cv clusterVolume) volumeSpec() (volume.Spec, error) {
	vs, err := volumeSpec(cv.ID, cv.Spec)
	vs.CapacityBytes, vs.AccessibleTopology = cv.CapacityBytes, cv.AccessibleTopology
	vs.MutableParameters = cv.MutableParameters
	return vs, err
}

// decodeClusterVolume decodes volume id's definition as etcd holds it,
// opening its sealed secrets with keys. stale counts the secrets that
// keys's current key did not seal (sealed with a previous key, or in
// clear), which ResealSecrets seals again; 0 without keys.
func decodeClusterVolume(id string, def []byte, keys *seal.Keyring) (cv clusterVolume, stale int, err error) {
	var w struct {
		clusterVolume
		SealedSecrets map[string]string `json:"sealed_secrets,omitempty"`
	}
	if err := json.Unmarshal(def, &w); err != nil {
		return cv, 0, fmt.Errorf("decode the cluster's definition of volume %q: %w", id, err)
	}
	cv = w.clusterVolume
	cv.ID = id
	if keys.Enabled() {
		stale = len(cv.Spec.Secrets) + keys.Stale(w.SealedSecrets)
	}
	if w.SealedSecrets != nil {
		if cv.Spec.Secrets, err = keys.OpenMap(clusterRecord(id), w.SealedSecrets); err != nil {
			return cv, 0, fmt.Errorf("the cluster's definition of volume %q: %w", id, err)
		}
	}
	return cv, stale, nil
}

// startCluster joins the cluster: r.cluster is the session, set before
// the volume manager starts (it is the manager's Arbiter).
func (r *Runtime) startCluster(ctx context.Context) error {
	sc, err := r.cfg.Cluster.sessionConfig()
	if err != nil {
		return &kindError{kind: ErrInvalid, err: err}
	}
	sc.Logger = r.log.WithField("component", "cluster")
	sc.Registerer = r.reg
	s, err := cluster.Open(ctx, sc)
	if err != nil {
		return fmt.Errorf("cluster: %w", mapErr(err))
	}
	r.cluster = s
	r.cache = newVolumeCache(r.cfg.Cluster.VolumeCache)
	if r.reg != nil {
		r.cacheGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "csiactor_cluster_volumes_kept",
			Help: "Volume definitions this host keeps in cluster mode: those it has claims on and at most cluster.volume_cache others.",
		}, func() float64 { return float64(r.cache.len()) })
		if err := r.reg.Register(r.cacheGauge); err != nil {
			r.cacheGauge = nil
			return fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	return nil
}

// afterVolumesStarted frees the claims etcd holds for this host that the
// host no longer has, then follows the cluster's volume definitions.
func (r *Runtime) afterVolumesStarted(ctx context.Context) error {
	n, err := r.cluster.Prune(ctx, func(vol, alloc string) bool {
		v, err := r.volumes.Get(ctx, vol)
		if err != nil {
			// Kept unless the volume is surely gone: a claim freed
			// wrongly would let another host's writer in.
			return !errors.Is(err, volume.ErrNotFound)
		}
		return slices.ContainsFunc(v.Claims, func(c volume.Claim) bool { return c.Alloc == alloc }) ||
			slices.ContainsFunc(v.PastClaims, func(c volume.Claim) bool { return c.Alloc == alloc })
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", mapErr(err))
	}
	if n > 0 {
		r.log.WithField("claims", n).Info("freed claims etcd held for this host that it no longer has")
	}
	fenced, err := r.releaseFenced(ctx)
	if err != nil {
		return fmt.Errorf("cluster: %w", mapErr(err))
	}
	if err := r.adoptClaims(ctx, fenced); err != nil {
		return fmt.Errorf("cluster: %w", mapErr(err))
	}
	wctx, cancel := context.WithCancel(context.Background())
	r.clusterCancel = cancel
	for _, id := range r.volumes.IDs() {
		r.cache.touch(id)
	}
	r.wg.Add(4)
	go func() {
		defer r.wg.Done()
		_ = r.cluster.WatchVolumes(wctx, r.volumes.IDs, r.clusterVolumeChanged, func() { r.clusterListed.Store(true) })
	}()
	go r.evictLoop(wctx)
	go r.followRejoins(wctx)
	go r.followControllers(wctx)
	return nil
}

// clusterVolumeChanged mirrors here a volume definition of the cluster
// that this host keeps (see keeps: whatever its plugin knows, see
// volume.Manager.Mirror), and deregisters such a volume deregistered
// there. The changes of the volumes it does not keep are dropped: a call
// that needs one reads it from etcd (see hold).
func (r *Runtime) clusterVolumeChanged(e cluster.VolumeEvent) {
	if !r.keeps(e.ID) {
		return
	}
	log := r.log.WithFields(logrus.Fields{"component": "cluster", "volume": e.ID})
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Plugins.RPCTimeout)
	defer cancel()
	if e.Def == nil {
		if r.isDeleting(e.ID) {
			return // DeleteVolume on this host does it
		}
		r.mirrorMu.Lock()
		defer r.mirrorMu.Unlock()
		if e.Rev <= r.mirrored[e.ID] {
			return // registered again since, and mirrored already
		}
		if r.cache.pinned(e.ID) {
			// A hold may be mirroring an older definition it read:
			// this revision keeps it from doing so.
			r.mirrored[e.ID] = e.Rev
		} else {
			delete(r.mirrored, e.ID)
			r.cache.drop(e.ID)
			r.cluster.Forget(e.ID)
		}
		err := r.volumes.Deregister(ctx, e.ID)
		if err != nil && !errors.Is(err, volume.ErrNotFound) {
			log.WithError(err).Warn("volume deregistered in the cluster cannot be deregistered here")
		}
		return
	}
	cv, _, err := decodeClusterVolume(e.ID, e.Def, r.keys)
	if err != nil {
		log.WithError(err).Warn("cannot decode a volume definition from the cluster; skipped")
		return
	}
	if !cv.Created {
		if v, err := r.volumes.Get(ctx, e.ID); err == nil && v.Created && v.ExternalID == cv.Spec.ExternalID {
			if err := r.completeShared(ctx, v); err != nil {
				log.WithError(err).Warn("cannot complete the cluster's definition of a volume created here")
			}
			return // the watch brings the completed definition
		}
	}
	if _, err := r.mirror(ctx, cv, e.Rev); err != nil {
		log.WithError(err).Warn("cannot mirror the cluster's definition of a volume here")
		return
	}
	log.Debug("mirrored the cluster's definition of a volume")
}

// completeShared adds to the cluster's definition of v, a volume this host
// created and shared before definitions carried what the plugin said of
// a created volume, the volume context, capacity and accessible topology
// of this host's record: mirrored as it was, it would take them from
// this host's record too.
func (r *Runtime) completeShared(ctx context.Context, v volume.Volume) error {
	_, err := r.updateShared(ctx, v.ID, func(cur *clusterVolume) (clusterVolume, bool, bool, error) {
		if cur == nil || cur.Created || cur.Spec.ExternalID != v.ExternalID {
			return clusterVolume{}, false, false, nil
		}
		next := *cur
		next.Created, next.Spec.Context = true, v.Context
		next.CapacityBytes = max(cur.CapacityBytes, v.CapacityBytes)
		next.AccessibleTopology = v.AccessibleTopology
		return next, false, true, nil
	})
	return err
}

// mirror makes this host's record of volume cv.ID the cluster's
// definition cv, at etcd revision rev, unless a later one is mirrored
// already; it returns the record.
func (r *Runtime) mirror(ctx context.Context, cv clusterVolume, rev int64) (volume.Volume, error) {
	vs, err := cv.volumeSpec()
	if err != nil {
		return volume.Volume{}, err
	}
	r.mirrorMu.Lock()
	defer r.mirrorMu.Unlock()
	if rev < r.mirrored[cv.ID] {
		return r.volumes.Get(ctx, cv.ID)
	}
	v, err := r.volumes.Mirror(ctx, vs)
	if err != nil {
		return v, err
	}
	if r.mirrored == nil {
		r.mirrored = map[string]int64{}
	}
	r.mirrored[cv.ID] = rev
	r.cluster.Applied(cv.ID, rev)
	r.cache.touch(cv.ID)
	return v, nil
}

// staleWait bounds each wait of claimApplied for this host to apply
// another host's update of the volume (its watch brings it at once).
const staleWait = 5 * time.Second

// claimApplied runs claim, and again while it fails because the volume's
// definition in the cluster changed since this host's record got it (a
// cluster.StaleError: another host's update, which this host's watch is
// bringing), once this host applied the new one. A claim is never
// published with a definition the cluster replaced.
func (r *Runtime) claimApplied(ctx context.Context, claim func() (volume.Claim, error)) (volume.Claim, error) {
	for {
		c, err := claim()
		var se *cluster.StaleError
		if r.cluster == nil || !errors.As(err, &se) {
			return c, err
		}
		wctx, cancel := context.WithTimeout(ctx, staleWait)
		werr := r.cluster.WaitApplied(wctx, se.Volume, se.Applied)
		cancel()
		if werr != nil {
			return c, err
		}
	}
}

// maxUpdateRounds bounds the compare-and-swap rounds of one update of a
// definition in the cluster; each lost round means another host changed
// it meanwhile.
const maxUpdateRounds = 16

// updateShared applies change to the cluster's definition of volume id
// by compare-and-swap, and mirrors the result here. change gets the
// definition (nil when the cluster has none) and returns the new one,
// whether a claim anywhere must hold it back (ErrConflict naming the
// claims), and false to leave the cluster as it is (cv is then ignored).
func (r *Runtime) updateShared(ctx context.Context, id string,
	change func(cur *clusterVolume) (next clusterVolume, unclaimed, write bool, err error)) (volume.Volume, error) {
	for range maxUpdateRounds {
		raw, rev, err := r.cluster.VolumeDefRev(ctx, id)
		if err != nil {
			return volume.Volume{}, mapErr(err)
		}
		var cur *clusterVolume
		stale := 0
		if raw != nil {
			cv, n, err := decodeClusterVolume(id, raw, r.keys)
			if err != nil {
				return volume.Volume{}, err
			}
			cur, stale = &cv, n
		}
		next, unclaimed, write, err := change(cur)
		if err != nil || !write {
			return volume.Volume{}, err
		}
		// Written when it changed, or to seal secrets the current key
		// did not.
		if cur == nil || stale > 0 || !sameShared(*cur, next) {
			def, err := next.encode(r.keys)
			if err != nil {
				return volume.Volume{}, err
			}
			rev, err = r.cluster.UpdateVolume(ctx, id, rev, def, unclaimed)
			if errors.Is(err, cluster.ErrConflict) {
				continue // changed meanwhile: read it again
			}
			if err != nil {
				return volume.Volume{}, mapErr(err)
			}
		}
		v, err := r.mirror(ctx, next, rev)
		return v, mapErr(err)
	}
	return volume.Volume{}, kinderr.Errorf(ErrClusterUnavailable, "the cluster's definition of volume %q kept changing; try again", id)
}

// registerShared is RegisterVolume in cluster mode, where the definitions
// in etcd are the truth. A volume new to the cluster is registered here
// first (this host's plugin validates it), then shared. The definition the
// cluster has is mirrored here without asking the plugin. Another
// definition is an update by RegisterVolume's rules, written to etcd by
// compare-and-swap (the fields a claim depends on only while no host holds
// a claim) and mirrored here; every other host mirrors it from its watch.
func (r *Runtime) registerShared(ctx context.Context, id string, spec VolumeSpec, vs volume.Spec) (volume.Volume, error) {
	isNew := false
	var held []string
	v, err := r.updateShared(ctx, id, func(cur *clusterVolume) (clusterVolume, bool, bool, error) {
		if isNew = cur == nil; isNew {
			return clusterVolume{}, false, false, nil
		}
		next := *cur
		next.Spec = spec
		old, err := cur.volumeSpec()
		if err != nil {
			return next, false, false, err
		}
		if held, err = volume.CheckUpdate(old, vs); err != nil {
			return next, false, false, mapErr(err)
		}
		return next, len(held) > 0, true, nil
	})
	if errors.Is(err, cluster.ErrInUse) {
		return v, fmt.Errorf("%w: %s cannot change while it has claims (only secrets can); release them first", err, strings.Join(held, ", "))
	}
	if !isNew || err != nil {
		return v, err
	}
	// Refused before this host registers it: the plugin volume may be
	// another volume of the cluster, which this host does not keep.
	owner, _, err := r.cluster.ExternalOwner(ctx, spec.Plugin, spec.ExternalID)
	if err != nil {
		return v, mapErr(err)
	}
	if owner != "" && owner != id {
		return v, kinderr.Errorf(ErrConflict, "plugin %s's volume %q is registered in the cluster as volume %q", spec.Plugin, spec.ExternalID, owner)
	}
	if v, err = r.volumes.Register(ctx, vs); err != nil {
		return v, mapErr(err)
	}
	return v, r.shareVolume(ctx, clusterVolume{ID: id, Spec: spec})
}

// markDeleting counts a DeleteVolume of id under way; call the function
// it returns when it is done.
func (r *Runtime) markDeleting(id string, n int) func() {
	r.deletingMu.Lock()
	defer r.deletingMu.Unlock()
	if r.deleting == nil {
		r.deleting = map[string]int{}
	}
	r.deleting[id] += n
	return func() {
		r.deletingMu.Lock()
		defer r.deletingMu.Unlock()
		if r.deleting[id] -= n; r.deleting[id] <= 0 {
			delete(r.deleting, id)
		}
	}
}

func (r *Runtime) isDeleting(id string) bool {
	r.deletingMu.Lock()
	defer r.deletingMu.Unlock()
	return r.deleting[id] > 0
}

// shareVolume records cv, the definition of a volume new to the cluster,
// for every host (a no-op outside cluster mode).
func (r *Runtime) shareVolume(ctx context.Context, cv clusterVolume) error {
	if r.cluster == nil {
		return nil
	}
	def, err := cv.encode(r.keys)
	if err != nil {
		return err
	}
	err = r.cluster.PutVolumeOf(ctx, cv.ID, cv.Spec.Plugin, cv.Spec.ExternalID, def)
	if err == nil {
		r.cache.touch(cv.ID)
	}
	if errors.Is(err, cluster.ErrConflict) && r.keys.Enabled() {
		// Sealed secrets differ at every encoding: the same definition
		// again is still a no-op.
		if raw, rerr := r.cluster.VolumeDef(ctx, cv.ID); rerr == nil && raw != nil {
			if cur, _, derr := decodeClusterVolume(cv.ID, raw, r.keys); derr == nil && sameShared(cur, cv) {
				return nil
			}
		}
	}
	return mapErr(err)
}

// resealShared seals again, with the current key, the secrets of every
// volume definition in etcd that it did not seal, by compare-and-swap, and
// returns how many secret values it sealed.
func (r *Runtime) resealShared(ctx context.Context) (int, error) {
	ids, err := r.cluster.VolumeIDs(ctx)
	if err != nil {
		return 0, mapErr(err)
	}
	total := 0
	for _, id := range ids {
		n, err := r.resealOne(ctx, id)
		if err != nil {
			return total, fmt.Errorf("reseal the cluster's definition of volume %q: %w", id, err)
		}
		total += n
	}
	return total, nil
}

// shareCapacity records in the cluster that volume id was expanded to
// capacity here, for every host's record (a no-op outside cluster mode,
// and for a volume the cluster does not have).
func (r *Runtime) shareCapacity(ctx context.Context, id string, capacity int64) error {
	if r.cluster == nil {
		return nil
	}
	_, err := r.updateShared(ctx, id, func(cur *clusterVolume) (clusterVolume, bool, bool, error) {
		if cur == nil || cur.CapacityBytes >= capacity {
			return clusterVolume{}, false, false, nil
		}
		next := *cur
		next.CapacityBytes = capacity
		return next, false, true, nil
	})
	return err
}

// shareMutableParameters records in the cluster the mutable parameters
// volume id has here after a modification, merged into the definition's,
// for every host's record (a no-op outside cluster mode, and for a volume
// the cluster does not have).
func (r *Runtime) shareMutableParameters(ctx context.Context, id string, params map[string]string) error {
	if r.cluster == nil {
		return nil
	}
	_, err := r.updateShared(ctx, id, func(cur *clusterVolume) (clusterVolume, bool, bool, error) {
		if cur == nil {
			return clusterVolume{}, false, false, nil
		}
		next := *cur
		next.MutableParameters = maps.Clone(cur.MutableParameters)
		if next.MutableParameters == nil {
			next.MutableParameters = map[string]string{}
		}
		maps.Copy(next.MutableParameters, params)
		return next, false, !maps.Equal(next.MutableParameters, cur.MutableParameters), nil
	})
	return err
}

// resealOne seals again the secrets of volume id's definition that the
// current key did not seal, by compare-and-swap, and returns how many.
// Other hosts' watches see the same definition in clear: nothing changes
// for them.
func (r *Runtime) resealOne(ctx context.Context, id string) (int, error) {
	for range maxUpdateRounds {
		raw, rev, err := r.cluster.VolumeDefRev(ctx, id)
		if err != nil || raw == nil {
			return 0, mapErr(err)
		}
		cv, stale, err := decodeClusterVolume(id, raw, r.keys)
		if err != nil || stale == 0 {
			return 0, err
		}
		def, err := cv.encode(r.keys)
		if err != nil {
			return 0, err
		}
		if _, err := r.cluster.UpdateVolume(ctx, id, rev, def, false); errors.Is(err, cluster.ErrConflict) {
			continue // changed meanwhile: read it again
		} else if err != nil {
			return 0, mapErr(err)
		}
		return stale, nil
	}
	return 0, kinderr.Errorf(ErrClusterUnavailable, "the cluster's definition of volume %q kept changing; try again", id)
}

// Node is one host of the cluster.
type Node struct {
	ID string `json:"id"`
	// Status is NodeUp or NodeDown.
	Status string `json:"status"`
	// Self is true for this agent's host.
	Self bool `json:"self,omitempty"`
	// StartedAt is when the host's agent last joined; LastSeen when it
	// last renewed its lease.
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// Claims is how many claims the host holds, as the cluster records
	// them.
	Claims int `json:"claims"`
}

// Node statuses.
const (
	// NodeUp: the host's lease is alive.
	NodeUp = cluster.StatusUp
	// NodeDown: the host's lease expired or was revoked; its claims stay
	// and block other writers until they are released.
	NodeDown = cluster.StatusDown
)

// InCluster reports whether the runtime runs in cluster mode: its config
// has a cluster section. It never blocks, and holds before Start.
func (r *Runtime) InCluster() bool { return r.cfg.Cluster != nil }

// Nodes lists the hosts of the cluster, by ID. Outside cluster mode it
// fails with an error wrapping ErrNotFound.
func (r *Runtime) Nodes(ctx context.Context) ([]Node, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	if r.cluster == nil {
		return nil, kinderr.Errorf(ErrNotFound, "not in cluster mode (the agent has no cluster section)")
	}
	hs, err := r.cluster.Hosts(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Node, 0, len(hs))
	for _, h := range hs {
		out = append(out, Node{ID: h.ID, Status: h.Status, Self: h.ID == r.cluster.NodeID(),
			StartedAt: h.StartedAt, LastSeen: h.LastSeen, Claims: h.Claims})
	}
	return out, nil
}

// Node returns one host of the cluster, or an error wrapping ErrNotFound.
func (r *Runtime) Node(ctx context.Context, id string) (Node, error) {
	if err := ValidateID("id", id); err != nil {
		return Node{}, err
	}
	ns, err := r.Nodes(ctx)
	if err != nil {
		return Node{}, err
	}
	for _, n := range ns {
		if n.ID == id {
			return n, nil
		}
	}
	return Node{}, kinderr.Errorf(ErrNotFound, "node %q is not in the cluster", id)
}

// withHosts sets the host of v's claims (this host's) and adds, of the
// claims the cluster records for v, those other hosts hold (state
// ClaimRemote). In local mode it returns v unchanged.
func (r *Runtime) withHosts(v Volume, recorded []cluster.HostClaim) Volume {
	if r.cluster == nil {
		return v
	}
	self := r.cluster.NodeID()
	for i := range v.Claims {
		v.Claims[i].Host = self
	}
	for i := range v.PastClaims {
		v.PastClaims[i].Host = self
	}
	for _, c := range recorded {
		if c.Host == self {
			continue
		}
		v.Claims = append(v.Claims, Claim{Host: c.Host, Alloc: c.Alloc, Mode: c.Mode,
			AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode, State: ClaimRemote})
	}
	return v
}

// ClaimRemote is the state shown for a claim another host of the cluster
// holds: its steps are that host's.
const ClaimRemote = "remote"

// adoptClaims records in etcd the claims and unfreed past claims this host
// holds that etcd does not have: those made before cluster mode was turned
// on, or kept while etcd lost its data. They are on the host already, so
// they are recorded even where the access-mode table across hosts refuses
// them (another host claimed the volume meanwhile); an error line names
// both, for an operator to release one. The claims in skip (just released
// because another host fenced them) are left out. A claim freed while it
// was recorded (a teardown resumed at start) is freed in etcd again.
func (r *Runtime) adoptClaims(ctx context.Context, skip map[[2]string]bool) error {
	vs, err := r.volumes.List(ctx, volume.Filter{})
	if err != nil {
		return err
	}
	self := r.cluster.NodeID()
	n := 0
	for _, v := range vs {
		for _, c := range slices.Concat(v.Claims, v.PastClaims) {
			if skip[[2]string{v.ID, c.Alloc}] {
				continue
			}
			log := r.log.WithFields(logrus.Fields{"component": "cluster", "volume": v.ID, "alloc": c.Alloc})
			am, err1 := csi.ParseAccessMode(c.AccessMode)
			at, err2 := csi.ParseAttachmentMode(c.AttachmentMode)
			mode, err3 := claim.ParseMode(c.Mode)
			if err := errors.Join(err1, err2, err3); err != nil {
				log.WithError(err).Error("cannot record a claim of this host in the cluster")
				continue
			}
			req := claim.Request{Alloc: c.Alloc, Mode: mode, Capability: csi.VolumeCapability{AccessMode: am, AttachmentMode: at}}
			pc := persistence.Claim{Alloc: c.Alloc, Mode: c.Mode, AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode,
				NodeID: c.NodeID, ControllerRequired: v.ControllerPublished || c.State != ClaimPublished}
			wrote := false
			err := r.cluster.Admit(ctx, v.ID, pc, func(held []persistence.Claim) error {
				wrote = true
				if err := claim.AdmitHosts(self, req, held); err != nil {
					log.WithError(err).Error("a claim this host holds clashes with the cluster's; recording it anyway: release one of them")
				}
				return nil
			})
			if err != nil {
				return err
			}
			if !wrote {
				continue
			}
			n++
			// The list may be older than the claim's end: a teardown
			// resumed at start can free it meanwhile, and its free
			// found nothing to remove yet.
			if cur, err := r.volumes.Get(ctx, v.ID); errors.Is(err, volume.ErrNotFound) ||
				(err == nil && !slices.ContainsFunc(slices.Concat(cur.Claims, cur.PastClaims), func(x volume.Claim) bool { return x.Alloc == c.Alloc })) {
				r.cluster.Free(v.ID, c.Alloc)
			}
		}
	}
	if n > 0 {
		r.log.WithField("claims", n).Warn("recorded in the cluster claims this host held that etcd did not have")
	}
	return nil
}
