package runtime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// Event types of day-2 operations: an updated volume, and the escape
// hatches out of stuck states (each also logged at warning level).
const (
	// EventVolumeUpdated: PUT /v1/volumes/{id} changed a registered
	// volume; the message names the changed fields, never their values.
	EventVolumeUpdated = volume.EventVolumeUpdated
	// EventClaimForceReleased: a claim was forgotten by a forced release;
	// the message names what may be left.
	EventClaimForceReleased = volume.EventClaimForceReleased
	// EventVolumeForceDeregistered: a volume was forgotten with past
	// claims not freed; the message names them and what may be left.
	EventVolumeForceDeregistered = volume.EventVolumeForceDeregistered
	// EventClaimWaiting: a claim that other claims keep out waits for
	// them to go (ClaimWait); the message says how long at most, and why.
	EventClaimWaiting = volume.EventClaimWaiting
	// EventAllocationForceDeregistered: an allocation was deregistered by
	// force; the message names the claims left without a healthy
	// allocation of its plugin.
	EventAllocationForceDeregistered = "allocation-force-deregistered"
)

// MaxClaimWait is the longest a claim may wait for a conflicting claim to
// go (ClaimWait, POST /v1/volumes/{id}/claims?wait=).
const MaxClaimWait = volume.MaxClaimWait

// ParseClaimWait parses the wait of a claim ("30s", "2m"): a Go duration,
// more than 0 and at most MaxClaimWait. The error names the field.
func ParseClaimWait(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxClaimWait {
		return 0, fieldErr("wait", fmt.Sprintf("%q: want a duration like 30s, more than 0 and at most %s", s, MaxClaimWait))
	}
	return d, nil
}

// ClaimWait is Claim, except that a claim refused because other claims
// hold its place (the access mode's limit, or the same alloc's previous
// claim still being released) waits up to wait (at most MaxClaimWait)
// for them to go, trying again each time the volume changes, instead of
// failing at once. After wait it fails with the last ErrConflict. A ctx
// that ends (the HTTP client went away) ends the wait.
func (r *Runtime) ClaimWait(ctx context.Context, volumeID string, req ClaimRequest, wait time.Duration) (Claim, error) {
	if wait <= 0 || wait > MaxClaimWait {
		return Claim{}, fieldErr("wait", fmt.Sprintf("%s: want more than 0 and at most %s", wait, MaxClaimWait))
	}
	if req.Ephemeral != nil {
		return Claim{}, fieldErr("wait", "not available with ephemeral: an ephemeral volume is created for the claim")
	}
	vr, err := r.claimRequest(volumeID, req)
	if err != nil {
		return Claim{}, err
	}
	release, err := r.hold(ctx, volumeID)
	if err != nil {
		return Claim{}, err
	}
	defer release()
	c, err := waitOut(ctx, pluginWaiter{r: r, op: "claim", vol: volumeID, alloc: req.Alloc}, func() (volume.Claim, error) {
		return r.claimApplied(ctx, func() (volume.Claim, error) { return r.volumes.ClaimWait(ctx, vr, wait) })
	})
	if err != nil {
		return Claim{}, mapErr(err)
	}
	return claimFromManager(c), nil
}

// ForceRelease is the way out of a release that a broken plugin refuses
// forever: it sends each teardown RPC the claim still needs once
// (NodeUnpublishVolume, NodeUnstageVolume, ControllerUnpublishVolume, as
// they apply), whatever they answer, and forgets the claim. A current
// claim is released first, then forced the same way. The returned claim
// is in state freed; Left names what may be left on the host or the
// storage (a target mount, a staging, a controller attachment) with each
// RPC's error; the EventClaimForceReleased event and a warning say the
// same. The volume can be claimed again at once.
func (r *Runtime) ForceRelease(ctx context.Context, volumeID, alloc string) (ForcedRelease, error) {
	if err := ValidateID("volume", volumeID); err != nil {
		return ForcedRelease{}, err
	}
	if err := ValidateID("alloc", alloc); err != nil {
		return ForcedRelease{}, err
	}
	if err := r.ready(); err != nil {
		return ForcedRelease{}, err
	}
	c, left, err := r.volumes.ForceRelease(ctx, volumeID, alloc)
	if err != nil {
		return ForcedRelease{}, mapErr(err)
	}
	return ForcedRelease{Claim: claimFromManager(c), Left: left}, nil
}

// ForcedRelease is what a forced release answers: the claim, in state
// freed, and what its last teardown may have left.
type ForcedRelease struct {
	Claim
	// Left names what may be left on the host or the storage (a target
	// mount, a staging, a controller attachment), each with its RPC's
	// error; empty when the last teardown succeeded.
	Left []string `json:"left"`
}

// ForceDeregisterVolume forgets the volume id even though past claims of
// it are not freed (their teardown stops; nothing is sent to the plugin).
// The EventVolumeForceDeregistered event and a warning name the past
// claims and what each may leave. A volume with current claims is still
// ErrConflict: release them first (ForceRelease if their teardown is
// stuck). In cluster mode the volume is then deregistered in the cluster
// too, which etcd refuses while another host holds a claim on it.
func (r *Runtime) ForceDeregisterVolume(ctx context.Context, id string) error {
	if err := ValidateID("id", id); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	if r.cluster != nil {
		defer r.markDeleting(id, 1)()
	}
	release, err := r.hold(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	plugin, ext := r.externalOf(ctx, id)
	if _, err := r.volumes.ForceDeregister(ctx, id); err != nil {
		return mapErr(err)
	}
	if r.cluster != nil {
		if err := r.cluster.DeleteVolume(ctx, id); err != nil {
			return fmt.Errorf("volume %q is forgotten on this host, but not in the cluster: %w", id, mapErr(err))
		}
		r.forgetExternal(ctx, id, plugin, ext)
	}
	return nil
}

// ForceDeregisterAllocation deregisters the allocation id even when it is
// the last healthy node (or controller) allocation of its plugin and
// claims depend on it (DeregisterAllocation refuses that). Those claims
// stay, and their steps wait for a healthy allocation of the plugin; the
// EventAllocationForceDeregistered event and a warning name them.
func (r *Runtime) ForceDeregisterAllocation(ctx context.Context, id string) error {
	if err := r.ready(); err != nil {
		return err
	}
	deps, err := r.allocationDependents(ctx, id)
	if err != nil {
		return err
	}
	if err := r.deregisterAllocation(ctx, id); err != nil {
		return err
	}
	msg := "allocation deregistered by force; no claim depended on it alone"
	if deps != nil {
		msg = "allocation deregistered by force; " + deps.describe()
	}
	r.log.WithFields(logrus.Fields{"alloc": id, "plugin": depsPlugin(deps)}).Warn(msg)
	r.events.publish(Event{Time: time.Now(), Type: EventAllocationForceDeregistered, Plugin: depsPlugin(deps), Alloc: id, Message: msg})
	return nil
}

func (r *Runtime) deregisterAllocation(ctx context.Context, id string) error {
	err := r.registry.Deregister(ctx, id)
	r.plugins.invalidate()
	return mapErr(err)
}

// dependents are the claims that only one allocation of a plugin can
// serve now: it is the last healthy allocation of a role they need.
type dependents struct {
	alloc   string
	plugin  string
	healthy bool          // the allocation itself is healthy
	roles   []plugin.Role // the roles it is the last healthy allocation of
	claims  []string      // `volume "v": alloc "a" (state)`
}

func (d *dependents) describe() string {
	const show = 5
	list := d.claims
	more := ""
	if len(list) > show {
		more = fmt.Sprintf(" and %d more", len(list)-show)
		list = list[:show]
	}
	roles := make([]string, len(d.roles))
	for i, r := range d.roles {
		roles[i] = string(r)
	}
	what := "claim depends"
	if len(d.claims) != 1 {
		what = "claims depend"
	}
	whose := fmt.Sprintf("allocation %q is the last healthy %s allocation of plugin %q", d.alloc, strings.Join(roles, " and "), d.plugin)
	if !d.healthy {
		whose = fmt.Sprintf("allocation %q is unhealthy and plugin %q has no other healthy %s allocation", d.alloc, d.plugin, strings.Join(roles, " and "))
	}
	return fmt.Sprintf("%s, and %d %s on it: %s%s", whose, len(d.claims), what, strings.Join(list, ", "), more)
}

func depsPlugin(d *dependents) string {
	if d == nil {
		return ""
	}
	return d.plugin
}

// allocationDependents returns the claims (current ones, and past ones
// still being released) that need a role of allocation id when no other
// healthy allocation of its plugin serves that role: every claim needs
// the node role; the ones that went through ControllerPublishVolume need
// the controller role too. Nil when there are none, or id is unknown (the
// deregistration says so).
func (r *Runtime) allocationDependents(ctx context.Context, id string) (*dependents, error) {
	infos, err := r.registry.Allocations(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	i := slices.IndexFunc(infos, func(a registry.AllocationInfo) bool { return a.ID == id })
	if i < 0 {
		return nil, nil
	}
	self := infos[i]
	d := &dependents{alloc: id, plugin: self.Plugin, healthy: self.Healthy}
	for _, role := range self.Type.Roles() {
		other := slices.ContainsFunc(infos, func(a registry.AllocationInfo) bool {
			return a.ID != id && a.Plugin == self.Plugin && a.Healthy && a.Type.Serves(role)
		})
		if !other {
			d.roles = append(d.roles, role)
		}
	}
	if len(d.roles) == 0 {
		return nil, nil
	}
	node, controller := slices.Contains(d.roles, plugin.Node), slices.Contains(d.roles, plugin.Controller)
	vs, err := r.volumes.List(ctx, volume.Filter{Plugin: self.Plugin})
	if err != nil {
		return nil, mapErr(err)
	}
	for _, v := range vs {
		for _, c := range v.Claims {
			if node || (controller && c.ControllerRequired) {
				d.claims = append(d.claims, fmt.Sprintf("volume %q: alloc %q (%s)", v.ID, c.Alloc, c.State))
			}
		}
		for _, c := range v.PastClaims {
			needs := c.State == claim.StateTaken && node ||
				(c.State == claim.StateTaken || c.State == claim.StateNodeDetached) && controller && (c.ControllerRequired || v.ControllerPublished)
			if needs {
				d.claims = append(d.claims, fmt.Sprintf("volume %q: alloc %q (past claim, %s)", v.ID, c.Alloc, c.State))
			}
		}
	}
	if len(d.claims) == 0 {
		return nil, nil
	}
	return d, nil
}

// errAllocationInUse is the ErrConflict of deregistering an allocation
// claims depend on.
func errAllocationInUse(d *dependents) error {
	return kinderr.Errorf(ErrConflict, "%s; release them first, or deregister the allocation with force", d.describe())
}
