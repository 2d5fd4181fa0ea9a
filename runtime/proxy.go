package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/csi"
)

// ProxyDir is the directory under the data dir that holds the CSI proxy
// sockets (plugins.proxy): one <plugin>.sock per plugin.
const ProxyDir = "csi"

// ProxySocket returns the path of plugin name's CSI proxy socket,
// <data_dir>/csi/<name>.sock. It is served only with plugins.proxy on.
func (r *Runtime) ProxySocket(name string) string {
	return filepath.Join(r.cfg.DataDir, ProxyDir, name+".sock")
}

// roles returns the roles whose allocations serve m, in the order they
// are tried: controller (and group controller) RPCs go to the controller,
// node RPCs to the node,
// identity RPCs to the node and, for a plugin without one, the controller.
func roles(m csi.Method) []plugin.Role {
	switch m.Service {
	case csi.ServiceController, csi.ServiceGroupController:
		return []plugin.Role{plugin.Controller}
	case csi.ServiceNode:
		return []plugin.Role{plugin.Node}
	}
	return []plugin.Role{plugin.Node, plugin.Controller}
}

// forward sends one CSI call of method m to the allocation of plugin name
// that operations in the first available of rs go to now, and returns
// that allocation's ID. While the plugin has no healthy allocation there
// (a handover: the singleton deregistered, its successor not healthy yet)
// it waits for one; a call that fails because its allocation went away
// (its client closed, or its connection lost as it stopped) is sent again
// to the allocation that serves now (CSI calls are idempotent). Without a
// deadline on ctx, the wait is bounded by plugins.rpc_timeout. A plugin
// with no allocation in any of rs fails at once (ErrNotFound).
func (r *Runtime) forward(ctx context.Context, name string, m csi.Method, rs []plugin.Role, req, resp proto.Message) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.cfg.Plugins.RPCTimeout)
		defer cancel()
	}
	var failed string // the allocation whose client just went away
	for {
		t, err := r.serving(ctx, name, rs, failed)
		if err != nil {
			return "", err
		}
		err = t.Client.Invoke(ctx, m.FullName, req, resp)
		if errors.Is(err, csi.ErrClosed) || (status.Code(err) == codes.Unavailable && ctx.Err() == nil && r.movedOn(ctx, name, rs, t.Alloc)) {
			failed = t.Alloc
			continue
		}
		return t.Alloc, err
	}
}

// movedOn reports whether operations of plugin name no longer go to alloc:
// an Unavailable from alloc then came from its stopping, and the call is
// worth sending to its successor.
func (r *Runtime) movedOn(ctx context.Context, name string, rs []plugin.Role, alloc string) bool {
	for _, role := range rs {
		t, err := r.registry.Client(ctx, name, role)
		if err == nil {
			return t.Alloc != alloc
		}
		if !errors.Is(err, registry.ErrPluginNotFound) {
			return true // none healthy: serving waits for one
		}
	}
	return false
}

// serving returns the target of the first of rs plugin name has, other
// than the allocation failed, waiting while there is none healthy.
func (r *Runtime) serving(ctx context.Context, name string, rs []plugin.Role, failed string) (registry.Target, error) {
	var t registry.Target
	pick := func() (bool, error) {
		var err error
		for _, role := range rs {
			t, err = r.registry.Client(ctx, name, role)
			if err == nil && t.Alloc == failed {
				err = registry.ErrNoHealthyPlugin // still the one that went away
			}
			if !errors.Is(err, registry.ErrPluginNotFound) {
				break
			}
		}
		return !errors.Is(err, registry.ErrNoHealthyPlugin), err
	}
	// Asked once before waiting: a call finds a healthy allocation
	// without subscribing to the registry's events.
	done, err := pick()
	if !done {
		err = r.registry.WaitUntil(ctx, name, pick)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return registry.Target{}, fmt.Errorf("%w: waiting for a healthy allocation of plugin %q: %w", ErrPluginUnavailable, name, err)
		}
	}
	if err != nil {
		return registry.Target{}, mapErr(err)
	}
	return t, nil
}

// proxies serves the CSI proxy sockets (plugins.proxy): one gRPC server
// per plugin, started when the plugin's first allocation is registered and
// stopped (its socket removed) when its last one goes, and at shutdown.
type proxies struct {
	r   *Runtime
	dir string
	log *logrus.Entry

	mu      sync.Mutex
	servers map[string]*proxyServer // guarded by mu; by plugin name
	errs    map[string]string       // guarded by mu; why a plugin has no proxy
	closed  bool                    // guarded by mu
}

type proxyServer struct {
	srv  *grpc.Server
	path string
	done chan struct{} // closed when Serve returned
}

func newProxies(r *Runtime) *proxies {
	return &proxies{r: r, dir: filepath.Join(r.cfg.DataDir, ProxyDir), log: r.log.WithField("component", "proxy"),
		servers: map[string]*proxyServer{}, errs: map[string]string{}}
}

// sync serves a proxy for every plugin the registry knows and stops the
// others'. It is called from the registry event loop on every
// registration and deregistration.
func (p *proxies) sync(ctx context.Context) {
	sums, err := p.r.registry.Plugins(ctx)
	if err != nil {
		return // stopping; or the next event syncs again
	}
	want := map[string]bool{}
	for _, s := range sums {
		want[s.Name] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for name, s := range p.servers {
		if !want[name] {
			p.stopLocked(name, s)
		}
	}
	for name := range p.errs {
		if !want[name] {
			delete(p.errs, name)
		}
	}
	for name := range want {
		if p.servers[name] != nil || p.errs[name] != "" {
			continue
		}
		s, err := p.serve(name)
		if err != nil {
			p.errs[name] = err.Error()
			p.log.WithField("plugin", name).Error(err.Error())
			continue
		}
		p.servers[name] = s
		p.log.WithFields(logrus.Fields{"plugin": name, "socket": s.path}).Info("CSI proxy serving")
	}
}

// serve listens on name's proxy socket (mode 0600, in a 0700 directory)
// and serves the Identity, Controller and Node services there.
func (p *proxies) serve(name string) (*proxyServer, error) {
	path := p.r.ProxySocket(name)
	if len(path) > csi.MaxSocketPathLen {
		return nil, fmt.Errorf("CSI proxy of plugin %s: socket path %s is %d bytes, longer than the %d-byte unix socket limit; use a shorter data_dir or plugin name",
			name, path, len(path), csi.MaxSocketPathLen)
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, fmt.Errorf("CSI proxy of plugin %s: %w", name, err)
	}
	// A socket a previous agent left behind (killed before it removed it).
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("CSI proxy of plugin %s: remove old socket: %w", name, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("CSI proxy of plugin %s: %w", name, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("CSI proxy of plugin %s: %w", name, err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(p.handler(name)))
	s := &proxyServer{srv: srv, path: path, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = srv.Serve(l)
	}()
	return s, nil
}

// handler forwards every call on name's proxy socket: the request is
// decoded as its method's type (so unknown fields pass through too), sent
// with forward, and the plugin's answer or status returned as it is.
func (p *proxies) handler(name string) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		full, _ := grpc.MethodFromServerStream(stream)
		m, ok := csi.LookupMethod(full)
		if !ok {
			return status.Errorf(codes.Unimplemented, "unknown CSI method %s", full)
		}
		req := m.NewRequest()
		if err := stream.RecvMsg(req); err != nil {
			return err
		}
		resp := m.NewResponse()
		if _, err := p.r.forward(stream.Context(), name, m, roles(m), req, resp); err != nil {
			return proxyStatus(err)
		}
		return stream.SendMsg(resp)
	}
}

// proxyStatus turns an error of forward into the status the proxy's
// client gets: the plugin's own status as it is, the agent's errors as
// Unavailable (no allocation to forward to) or the context's code.
func proxyStatus(err error) error {
	if _, ok := status.FromError(err); ok && !errors.Is(err, ErrPluginUnavailable) && !errors.Is(err, ErrNotFound) {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// stopLocked stops name's server and removes its socket. p.mu is held.
func (p *proxies) stopLocked(name string, s *proxyServer) {
	s.srv.Stop()
	<-s.done
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.WithField("plugin", name).WithError(err).Warn("remove CSI proxy socket")
	}
	delete(p.servers, name)
	p.log.WithField("plugin", name).Info("CSI proxy stopped")
}

// close stops every proxy; later syncs start none.
func (p *proxies) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for name, s := range p.servers {
		p.stopLocked(name, s)
	}
}

// status returns name's proxy socket, or why it has none.
func (p *proxies) status(name string) (socket, problem string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.servers[name]; s != nil {
		return s.path, ""
	}
	return "", p.errs[name]
}

// withProxy sets p's proxy socket, or why it has none, with plugins.proxy.
func (r *Runtime) withProxy(p Plugin) Plugin {
	if r.proxy != nil {
		p.ProxySocket, p.ProxyError = r.proxy.status(p.Name)
	}
	return p
}
