// Package fakeplugin is a hand-written fake CSI plugin for tests and
// benchmarks: a real gRPC server on a real unix socket, serving the
// identity, controller and node services, with the bookkeeping a real plugin
// keeps (volumes created, controller-published, staged, published) but no
// real storage and no mounts.
//
// # Basics
//
//	p, endpoint := fakeplugin.Start(t, fakeplugin.Config{StageUnstage: true})
//	client, err := csi.Dial(ctx, endpoint)
//	...
//	p.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 2})
//	... // the next two NodeStageVolume calls fail, the third succeeds
//	p.Calls("NodeStageVolume") // 3
//	p.Staged()                 // volume ID → staging path
//
// Outside tests: New, then Serve(socketPath), then Stop. Serve returns once
// the socket listens; Stop shuts down gracefully and waits for every
// goroutine; Kill drops the listener and every connection at once (the
// socket file stays behind, as after a crash). A stopped or killed Plugin
// can Serve again and keeps its state, like a plugin process restarting on
// the same host.
//
// # Semantics
//
// The RPCs follow the CSI spec's idempotency rules: publishing the same
// volume to the same target twice succeeds; unpublishing, unstaging,
// controller-unpublishing or deleting something that is not there succeeds.
// Ordering the spec requires of the CO is enforced with FailedPrecondition:
// NodePublishVolume needs the volume staged at staging_target_path when the
// plugin has STAGE_UNSTAGE; NodeUnstageVolume needs no target still
// published; ControllerUnpublishVolume and DeleteVolume need the volume no
// longer staged or published on this node; node RPCs need the publish
// context of ControllerPublishVolume when the plugin has PUBLISH_UNPUBLISH.
//
// Method names in SetFault, Calls and LastRequest are the short gRPC method
// names ("NodePublishVolume"); an unknown name panics, so that a typo cannot
// make a test pass.
//
// # Caveats
//
// Only one node: ControllerPublishVolume to a second node while the volume
// is published to another fails with FailedPrecondition, whatever the
// access mode. Volumes not created through CreateVolume or AddVolume are
// accepted by every RPC unless Config.StrictVolumes is set.
package fakeplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Config says which services and capabilities the fake plugin has. The zero
// value is a node-only plugin without STAGE_UNSTAGE, named DefaultName.
type Config struct {
	// Name is GetPluginInfo's name; DefaultName when empty.
	Name string
	// VendorVersion is GetPluginInfo's vendor_version; DefaultVendorVersion
	// when empty.
	VendorVersion string
	// NodeID is NodeGetInfo's node_id; DefaultNodeID when empty.
	NodeID string
	// MaxVolumesPerNode is NodeGetInfo's max_volumes_per_node.
	MaxVolumesPerNode int64
	// Topology is NodeGetInfo's accessible_topology segments (none when
	// empty). With a topology the plugin announces
	// VOLUME_ACCESSIBILITY_CONSTRAINTS, and CreateVolume answers the
	// topology asked for (the first preferred, else the first requisite),
	// else this one, as the volume's accessible topology.
	Topology map[string]string

	// Controller: the plugin has the controller service (CONTROLLER_SERVICE
	// plugin capability). Without it controller RPCs fail with
	// Unimplemented. ControllerPublish and CreateDelete imply it.
	Controller bool
	// ControllerPublish: PUBLISH_UNPUBLISH_VOLUME controller capability.
	ControllerPublish bool
	// CreateDelete: CREATE_DELETE_VOLUME controller capability.
	CreateDelete bool
	// StageUnstage: STAGE_UNSTAGE_VOLUME node capability. Without it
	// NodeStageVolume and NodeUnstageVolume fail with Unimplemented.
	StageUnstage bool
	// ControllerExpand: EXPAND_VOLUME controller capability (it implies
	// Controller); NodeExpand: EXPAND_VOLUME node capability. Either one
	// announces the ONLINE volume expansion plugin capability, or OFFLINE
	// with OfflineExpansion. NodeExpansionRequired is what
	// ControllerExpandVolume answers in node_expansion_required. Without
	// the capability the expand RPCs fail with Unimplemented.
	ControllerExpand bool
	NodeExpand       bool
	// ControllerModify: MODIFY_VOLUME controller capability (it implies
	// Controller): ControllerModifyVolume merges the mutable parameters
	// into the volume's (Volume.MutableParameters), refusing with
	// InvalidArgument a name not in AcceptedMutableParameters. Without it
	// ControllerModifyVolume fails with Unimplemented.
	ControllerModify          bool
	AcceptedMutableParameters []string
	// GetCapacity: GET_CAPACITY controller capability; GetCapacity answers
	// Capacity bytes available (minus what its volumes take).
	// ListVolumes: LIST_VOLUMES controller capability; ListVolumes pages
	// through the volumes by ID. Each implies Controller.
	GetCapacity           bool
	Capacity              int64
	ListVolumes           bool
	OfflineExpansion      bool
	NodeExpansionRequired bool
	// Snapshots: CREATE_DELETE_SNAPSHOT and LIST_SNAPSHOTS controller
	// capabilities (it implies Controller): CreateSnapshot (idempotent by
	// name), DeleteSnapshot and ListSnapshots keep snapshots in memory,
	// and CreateVolume restores from one (NotFound for an unknown one).
	// Without it the snapshot RPCs fail with Unimplemented.
	Snapshots bool
	// Clone: CLONE_VOLUME controller capability (it implies Controller):
	// CreateVolume copies a volume it has (NotFound for an unknown one).
	// Without it a volume content source is InvalidArgument.
	Clone bool

	// VolumeStats: GET_VOLUME_STATS node capability; NodeGetVolumeStats
	// answers what SetUsage set for the volume (by default: its capacity,
	// all of it available, 1000 inodes free). NodeCondition: the legacy
	// VOLUME_CONDITION node capability (spec before v1.13), with the
	// condition SetCondition set in NodeGetVolumeStats' volume_condition.
	// GetVolume: GET_VOLUME controller capability (implies Controller);
	// ControllerCondition: the legacy VOLUME_CONDITION controller
	// capability, the condition in ControllerGetVolume's status.
	// VolumeHealth: GET_VOLUME_HEALTH on the node and (with Controller) the
	// controller; an abnormal condition is one DEGRADED entry.
	VolumeStats         bool
	NodeCondition       bool
	GetVolume           bool
	ControllerCondition bool
	VolumeHealth        bool

	// NotReady makes Probe answer ready=false (see SetReady).
	NotReady bool
	// OmitReady makes Probe answer without the ready field at all, as old
	// plugins do (which counts as ready).
	OmitReady bool
	// StrictVolumes makes every RPC on a volume that was neither created
	// nor added (AddVolume) fail with NotFound; the unpublish-type RPCs
	// then answer NotFound too, as the spec allows.
	StrictVolumes bool
	// CheckPaths makes NodeStageVolume require staging_target_path to be
	// an existing directory, and NodePublishVolume require the parent of
	// target_path to exist, as the spec says the CO ensures. Without it the
	// fake creates what is missing.
	CheckPaths bool
	// VolumeMountGroup: VOLUME_MOUNT_GROUP node capability (the fake
	// only records volume_mount_group; see LastRequest).
	VolumeMountGroup bool
}

// Defaults used for empty Config fields.
const (
	DefaultName          = "fake.csi.csiactor.io"
	DefaultVendorVersion = "1.0.0"
	DefaultNodeID        = "fake-node"
)

// DefaultCapacity is the capacity of a volume created without a required
// capacity.
const DefaultCapacity int64 = 1 << 30

// Fault changes how the plugin answers one method (see SetFault). In order:
// Delay, then Hang, then Code (with AfterApply), then Garbage.
type Fault struct {
	// Code, when not OK, is returned as the call's gRPC status, with
	// Message. The call has no effect unless AfterApply is set.
	Code    codes.Code
	Message string
	// AfterApply makes the call take effect before Code is returned: the
	// plugin did the work but the caller hears a failure (a lost reply).
	AfterApply bool
	// Delay is waited before answering (the call still answers normally
	// unless Code, Hang or Garbage says otherwise). It ends early, with the
	// context's error, when the caller gives up.
	Delay time.Duration
	// Hang blocks the call until the caller's context ends, the plugin
	// stops (Unavailable) or it is killed.
	Hang bool
	// Garbage makes a successful answer break the spec: GetPluginInfo with
	// an empty name, CreateVolume with an empty volume_id, NodeGetInfo with
	// an empty node_id, NodeGetVolumeStats with negative used values.
	// Other methods have no required answer fields and answer normally.
	Garbage bool
	// Times is how many calls the fault applies to; 0 means every call
	// until ClearFaults.
	Times int
	// VolumeID, when set, limits the fault to calls whose request names
	// that volume (its volume_id): calls on other volumes answer normally
	// and do not count towards Times. One slow volume of a plugin that
	// answers everything else is such a fault.
	VolumeID string
}

// Volume is a volume the plugin knows, created by CreateVolume or added by
// AddVolume.
type Volume struct {
	ID            string
	Name          string
	CapacityBytes int64
	Parameters    map[string]string
	// Source is the snapshot or volume ID it was created from, if any.
	Source string
	// MutableParameters are what ControllerModifyVolume applied.
	MutableParameters map[string]string
}

type ctrlPub struct {
	node     string
	readonly bool
	cap      *csipb.VolumeCapability
}

type stage struct {
	path string
	cap  *csipb.VolumeCapability
}

type pub struct {
	readonly bool
	cap      *csipb.VolumeCapability
}

// Plugin is a fake CSI plugin. Its methods are safe for concurrent use.
type Plugin struct {
	cfg     Config
	methods map[string]bool // every CSI method name; read-only

	mu sync.Mutex
	// guarded by mu: serving generation
	srv       *grpc.Server
	lis       *net.UnixListener
	path      string
	serveDone chan struct{}
	stopCh    chan struct{}
	// guarded by mu: behaviour and recording
	ready   bool
	maxVols int64 // NodeGetInfo's max_volumes_per_node
	faults  map[string]*Fault
	calls   map[string]int
	last    map[string]proto.Message
	history []string
	// guarded by mu: the plugin's view of the world
	volumes map[string]*Volume
	ctrl    map[string]ctrlPub        // volume → controller publication
	staged  map[string]stage          // volume → staging
	pubs    map[string]map[string]pub // volume → target path → publication
	grown   map[string]int64          // target path → NodeExpandVolume's required bytes
	usage   map[string]Usage          // volume → what NodeGetVolumeStats answers
	conds   map[string]Condition      // volume → its condition
	snaps   map[string]*Snapshot      // snapshot ID → snapshot
}

// New returns a Plugin with cfg; it does not listen until Serve.
func New(cfg Config) *Plugin {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.VendorVersion == "" {
		cfg.VendorVersion = DefaultVendorVersion
	}
	if cfg.NodeID == "" {
		cfg.NodeID = DefaultNodeID
	}
	if cfg.ControllerPublish || cfg.CreateDelete || cfg.ControllerExpand || cfg.ControllerModify || cfg.GetCapacity || cfg.ListVolumes || cfg.GetVolume || cfg.Snapshots || cfg.Clone {
		cfg.Controller = true
	}
	cfg.Topology = maps.Clone(cfg.Topology)
	methods := map[string]bool{}
	svcs := csipb.File_csi_proto.Services()
	for i := range svcs.Len() {
		ms := svcs.Get(i).Methods()
		for j := range ms.Len() {
			methods[string(ms.Get(j).Name())] = true
		}
	}
	return &Plugin{
		cfg:     cfg,
		methods: methods,
		ready:   !cfg.NotReady,
		maxVols: cfg.MaxVolumesPerNode,
		faults:  map[string]*Fault{},
		calls:   map[string]int{},
		last:    map[string]proto.Message{},
		volumes: map[string]*Volume{},
		ctrl:    map[string]ctrlPub{},
		staged:  map[string]stage{},
		pubs:    map[string]map[string]pub{},
		grown:   map[string]int64{},
		usage:   map[string]Usage{},
		conds:   map[string]Condition{},
		snaps:   map[string]*Snapshot{},
	}
}

// Config returns the plugin's configuration, defaults filled in.
func (p *Plugin) Config() Config {
	c := p.cfg
	c.Topology = maps.Clone(c.Topology)
	return c
}

// ErrServing is returned by Serve when the plugin is already serving.
var ErrServing = errors.New("fakeplugin: already serving")

// Serve listens on the unix socket at socketPath and serves the identity,
// node and (with Config.Controller) controller services in a goroutine
// that Stop and Kill wait for. It returns once the socket listens. A stale
// socket file at socketPath (left by Kill, for example) is replaced.
func (p *Plugin) Serve(socketPath string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return fmt.Errorf("%w on %s", ErrServing, p.path)
	}
	if fi, err := os.Lstat(socketPath); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("fakeplugin: %s exists and is not a socket", socketPath)
		}
		if err := os.Remove(socketPath); err != nil {
			return fmt.Errorf("fakeplugin: remove stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("fakeplugin: listen: %w", err)
	}
	lis := l.(*net.UnixListener)
	stopCh := make(chan struct{})
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(p.interceptor(stopCh)),
		grpc.WaitForHandlers(true),
	)
	s := &server{p: p}
	csipb.RegisterIdentityServer(srv, s)
	csipb.RegisterNodeServer(srv, s)
	if p.cfg.Controller {
		csipb.RegisterControllerServer(srv, s)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis) // returns when Stop or GracefulStop closes lis
	}()
	p.srv, p.lis, p.path, p.serveDone, p.stopCh = srv, lis, socketPath, done, stopCh
	return nil
}

// SocketPath returns the socket path of the last Serve ("" before it).
func (p *Plugin) SocketPath() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.path
}

// Endpoint returns "unix://" + SocketPath().
func (p *Plugin) Endpoint() string { return "unix://" + p.SocketPath() }

// Stop shuts the server down gracefully: hanging calls return Unavailable,
// other calls finish, then the listener closes and the socket file is
// removed. It returns when every server goroutine has exited. It is
// idempotent and a no-op when not serving.
func (p *Plugin) Stop() { p.shutdown(false) }

// Kill stops the server abruptly, as if the plugin process died: the
// listener and every connection close at once (callers in flight see
// Unavailable), and the socket file stays behind. It returns when every
// server goroutine has exited. It is idempotent and a no-op when not
// serving.
func (p *Plugin) Kill() { p.shutdown(true) }

func (p *Plugin) shutdown(kill bool) {
	p.mu.Lock()
	srv, lis, done, stopCh := p.srv, p.lis, p.serveDone, p.stopCh
	p.srv, p.lis, p.serveDone, p.stopCh = nil, nil, nil, nil
	p.mu.Unlock()
	if srv == nil {
		return
	}
	if kill {
		lis.SetUnlinkOnClose(false)
		srv.Stop()
		close(stopCh)
	} else {
		close(stopCh)
		srv.GracefulStop()
	}
	<-done
}

// SetMaxVolumesPerNode sets what NodeGetInfo answers as
// max_volumes_per_node from now on (Config.MaxVolumesPerNode at first).
func (p *Plugin) SetMaxVolumesPerNode(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.maxVols = n
}

// SetReady sets what Probe answers from now on (ignored with OmitReady).
func (p *Plugin) SetReady(ready bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = ready
}

func (p *Plugin) mustKnow(method string) {
	if !p.methods[method] {
		panic(fmt.Sprintf("fakeplugin: unknown CSI method %q", method))
	}
}

// SetFault makes the next f.Times calls of method (every call when Times is
// 0) answer as f says, replacing any fault already set on method. It panics
// on an unknown method name.
func (p *Plugin) SetFault(method string, f Fault) {
	p.mustKnow(method)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[method] = &f
}

// ClearFaults removes every fault.
func (p *Plugin) ClearFaults() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.faults)
}

// Calls returns how many calls of method the plugin received, faulted ones
// included. Calls to the controller service of a plugin without
// Config.Controller are refused by gRPC before they reach the plugin and are
// not counted. It panics on an unknown method name.
func (p *Plugin) Calls(method string) int {
	p.mustKnow(method)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[method]
}

// LastRequest returns a copy of the last request of method, or nil. It
// panics on an unknown method name.
func (p *Plugin) LastRequest(method string) proto.Message {
	p.mustKnow(method)
	p.mu.Lock()
	m := p.last[method]
	p.mu.Unlock()
	if m == nil {
		return nil
	}
	return proto.Clone(m)
}

// History returns the names of the methods called, in the order received.
func (p *Plugin) History() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.history)
}

// AddVolume makes the plugin know a volume that exists outside it (a
// registered volume, in csiactor's terms), for Config.StrictVolumes.
func (p *Plugin) AddVolume(v Volume) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v.Parameters = maps.Clone(v.Parameters)
	p.volumes[v.ID] = &v
}

// Volumes returns the volumes the plugin knows, by ID.
func (p *Plugin) Volumes() map[string]Volume {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Volume, len(p.volumes))
	for id, v := range p.volumes {
		c := *v
		c.Parameters = maps.Clone(v.Parameters)
		c.MutableParameters = maps.Clone(v.MutableParameters)
		out[id] = c
	}
	return out
}

// ControllerPublished returns volume ID → node ID of every volume
// controller-published.
func (p *Plugin) ControllerPublished() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.ctrl))
	for id, c := range p.ctrl {
		out[id] = c.node
	}
	return out
}

// Staged returns volume ID → staging path of every volume staged.
func (p *Plugin) Staged() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.staged))
	for id, s := range p.staged {
		out[id] = s.path
	}
	return out
}

// Published returns volume ID → sorted target paths of every volume
// published.
func (p *Plugin) Published() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]string, len(p.pubs))
	for id, targets := range p.pubs {
		out[id] = slices.Sorted(maps.Keys(targets))
	}
	return out
}

// NodeExpanded returns target path → capacity of every NodeExpandVolume
// that succeeded, the last one per path.
func (p *Plugin) NodeExpanded() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.grown)
}

// interceptor records every call and applies faults. stopCh is closed when
// the serving generation ends.
func (p *Plugin) interceptor(stopCh <-chan struct{}) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
		if c := p.cfg.lacking(method); c != "" {
			handler = unimplemented(method, c)
		}
		f := p.record(method, req)
		if f == nil {
			return handler(ctx, req)
		}
		if f.Delay > 0 {
			t := time.NewTimer(f.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, status.FromContextError(ctx.Err()).Err()
			case <-stopCh:
				t.Stop()
				return nil, status.Error(codes.Unavailable, "fake plugin stopping")
			}
		}
		if f.Hang {
			select {
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			case <-stopCh:
				return nil, status.Error(codes.Unavailable, "fake plugin stopping")
			}
		}
		if f.Code != codes.OK {
			if f.AfterApply {
				_, _ = handler(ctx, req)
			}
			return nil, status.Error(f.Code, f.Message)
		}
		resp, err := handler(ctx, req)
		if err == nil && f.Garbage {
			garble(resp)
		}
		return resp, err
	}
}

// lacking returns the capability that method needs and the plugin lacks,
// or "". Such a call is still recorded and faulted like any other; only
// its answer is Unimplemented.
func (c Config) lacking(method string) string {
	switch method {
	case "CreateVolume", "DeleteVolume":
		if !c.CreateDelete {
			return "CREATE_DELETE_VOLUME"
		}
	case "ControllerPublishVolume", "ControllerUnpublishVolume":
		if !c.ControllerPublish {
			return "PUBLISH_UNPUBLISH_VOLUME"
		}
	case "NodeStageVolume", "NodeUnstageVolume":
		if !c.StageUnstage {
			return "STAGE_UNSTAGE_VOLUME"
		}
	case "GetCapacity":
		if !c.GetCapacity {
			return "GET_CAPACITY"
		}
	case "ListVolumes":
		if !c.ListVolumes {
			return "LIST_VOLUMES"
		}
	case "ControllerExpandVolume":
		if !c.ControllerExpand {
			return "EXPAND_VOLUME"
		}
	case "ControllerModifyVolume":
		if !c.ControllerModify {
			return "MODIFY_VOLUME"
		}
	case "NodeExpandVolume":
		if !c.NodeExpand {
			return "EXPAND_VOLUME"
		}
	case "NodeGetVolumeStats":
		if !c.VolumeStats {
			return "GET_VOLUME_STATS"
		}
	case "ControllerGetVolume":
		if !c.GetVolume {
			return "GET_VOLUME"
		}
	case "NodeGetVolumeHealth", "ControllerGetVolumeHealth":
		if !c.VolumeHealth {
			return "GET_VOLUME_HEALTH"
		}
	case "CreateSnapshot", "DeleteSnapshot":
		if !c.Snapshots {
			return "CREATE_DELETE_SNAPSHOT"
		}
	case "ListSnapshots":
		if !c.Snapshots {
			return "LIST_SNAPSHOTS"
		}
	}
	return ""
}

// unimplemented is the handler of a method whose capability the plugin
// lacks.
func unimplemented(method, capability string) grpc.UnaryHandler {
	err := status.Errorf(codes.Unimplemented, "%s: no %s capability", method, capability)
	return func(context.Context, any) (any, error) { return nil, err }
}

// record counts the call and returns the fault to apply, if any.
func (p *Plugin) record(method string, req any) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[method]++
	p.history = append(p.history, method)
	if m, ok := req.(proto.Message); ok {
		p.last[method] = m // never modified by the handlers
	}
	f := p.faults[method]
	if f == nil || (f.VolumeID != "" && volumeID(req) != f.VolumeID) {
		return nil
	}
	c := *f
	if f.Times > 0 {
		f.Times--
		if f.Times == 0 {
			delete(p.faults, method)
		}
	}
	return &c
}

// volumeID returns the volume a request names, or "".
func volumeID(req any) string {
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		return r.GetVolumeId()
	}
	return ""
}

// SetHangs sets a Hang fault for each entry of spec, a space-separated
// list of "Method" (every call of it hangs) or "Method@volume" (only its
// calls on that volume hang), as test binaries read it from their
// environment to run a fake plugin that hangs.
func (p *Plugin) SetHangs(spec string) {
	for _, e := range strings.Fields(spec) {
		method, vol, _ := strings.Cut(e, "@")
		p.SetFault(method, Fault{Hang: true, VolumeID: vol})
	}
}

// garble breaks a successful answer in the way Fault.Garbage describes.
func garble(resp any) {
	switch r := resp.(type) {
	case *csipb.GetPluginInfoResponse:
		r.Name = ""
	case *csipb.CreateVolumeResponse:
		if r.Volume != nil {
			r.Volume.VolumeId = ""
		}
	case *csipb.NodeGetInfoResponse:
		r.NodeId = ""
	case *csipb.NodeGetVolumeStatsResponse:
		for _, u := range r.Usage {
			u.Used = -1
		}
	}
}
