package dockerplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/runtime"
)

// EventMountReleased is the event of a mount released because no
// container of the engines held it any more (its Unmount never came).
const EventMountReleased = "docker-mount-released"

// ContentType is the media type of the protocol's bodies.
const ContentType = "application/vnd.docker.plugins.v1+json"

// maxBody bounds a request body.
const maxBody = 1 << 20

// removeWait bounds how long Remove waits for the teardown of the
// volume's released claims before it deletes the volume.
const removeWait = time.Minute

// teardownWait bounds how long a Mount waits for the teardown of earlier
// claims of Mounts on this host that hold the volume's place.
const teardownWait = 30 * time.Second

// Server serves the Docker volume plugin protocol for the drivers of the
// runtime's docker config. Start makes one; Shutdown stops it.
type Server struct {
	rt      *runtime.Runtime
	cfg     runtime.DockerConfig
	log     *logrus.Entry
	node    string // this host's cluster node ID; "" on one host
	book    *book
	engines []string
	// defaultEngines: engines are the defaults, each checked once its
	// socket has appeared (the engine may start after the agent).
	defaultEngines bool
	locks          [64]sync.Mutex // by volume name hash: one Create, Mount, Unmount or Remove of a volume at a time

	mu      sync.Mutex
	timers  map[mountKey]*time.Timer // guarded by mu; releases waiting out the grace period
	stopped bool                     // guarded by mu

	servers []*http.Server
	sockets []string
	ctx     context.Context // ends when Shutdown begins
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
}

// Start serves every driver of rt's docker config on its socket,
// releases the mounts an earlier run left with no reference, and starts
// reconciling with the engines. rt must be started. Shutdown stops it.
func Start(ctx context.Context, rt *runtime.Runtime, log *logrus.Entry) (*Server, error) {
	cfg := rt.Config()
	if cfg.Docker == nil {
		return nil, fmt.Errorf("%w: the docker section is not set", runtime.ErrInvalid)
	}
	b, err := openBook(filepath.Join(cfg.DataDir, "docker", "mounts.json"))
	if err != nil {
		return nil, err
	}
	s := &Server{
		rt: rt, cfg: *cfg.Docker, log: log, book: b,
		timers: map[mountKey]*time.Timer{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Cluster != nil {
		s.node = cfg.Cluster.NodeID
	}
	s.engines, s.defaultEngines = s.cfg.Engines, len(s.cfg.Engines) == 0
	if s.defaultEngines {
		s.engines = runtime.DefaultDockerEngines
	}
	if err := os.MkdirAll(s.cfg.PluginDir, 0o755); err != nil {
		return nil, fmt.Errorf("docker.plugin_dir: %w", err)
	}
	for _, d := range s.cfg.Drivers {
		if err := s.serve(d); err != nil {
			s.Shutdown(ctx)
			return nil, err
		}
	}
	for _, e := range b.entries("") {
		if e.Refs == 0 {
			s.scheduleRelease(mountKey{e.Volume, e.ID})
		}
	}
	s.log.WithFields(logrus.Fields{"plugin_dir": s.cfg.PluginDir, "drivers": len(s.cfg.Drivers), "engines": s.engines}).Info("serving Docker volume drivers")
	s.wg.Add(1)
	go s.reconcileLoop()
	return s, nil
}

// serve listens on d's socket and serves its protocol.
func (s *Server) serve(d runtime.DockerDriver) error {
	path := filepath.Join(s.cfg.PluginDir, d.Name+".sock")
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("docker driver %q: %s is in use by another process", d.Name, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("docker driver %q: %w", d.Name, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("docker driver %q: %w", d.Name, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return fmt.Errorf("docker driver %q: %w", d.Name, err)
	}
	srv := &http.Server{Handler: s.handler(d), ReadHeaderTimeout: 10 * time.Second}
	s.servers = append(s.servers, srv)
	s.sockets = append(s.sockets, path)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			s.log.WithError(err).WithField("driver", d.Name).Error("docker driver socket stopped serving")
		}
	}()
	return nil
}

// Shutdown stops serving, removes the sockets and stops the grace timers
// (their releases run at the next Start), and returns when every
// goroutine has ended or ctx is done. Claims stay as they are. It is
// idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	s.once.Do(func() {
		s.cancel()
		s.mu.Lock()
		s.stopped = true
		for k, t := range s.timers {
			if t.Stop() {
				s.wg.Done()
			}
			delete(s.timers, k)
		}
		s.mu.Unlock()
		for _, srv := range s.servers {
			if err := srv.Shutdown(ctx); err != nil {
				errs = append(errs, err, srv.Close())
			}
		}
		for _, p := range s.sockets {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	})
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// lock serializes the operations on one volume.
func (s *Server) lock(volume string) func() {
	h := fnv.New32a()
	h.Write([]byte(volume))
	m := &s.locks[h.Sum32()%uint32(len(s.locks))]
	m.Lock()
	return m.Unlock
}

// The protocol's bodies.
type (
	nameRequest struct {
		Name string `json:"Name"`
	}
	createRequest struct {
		Name string            `json:"Name"`
		Opts map[string]string `json:"Opts"`
	}
	mountRequest struct {
		Name string `json:"Name"`
		ID   string `json:"ID"`
	}
	volumeInfo struct {
		Name       string         `json:"Name"`
		Mountpoint string         `json:"Mountpoint,omitempty"`
		CreatedAt  string         `json:"CreatedAt,omitempty"`
		Status     map[string]any `json:"Status,omitempty"`
	}
)

func (s *Server) handler(d runtime.DockerDriver) http.Handler {
	mux := http.NewServeMux()
	handle := func(path string, fn func(ctx context.Context, body []byte) (any, error)) {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
			if err == nil && len(body) > maxBody {
				err = fmt.Errorf("%w: request body over %d bytes", runtime.ErrInvalid, maxBody)
			}
			var out any
			if err == nil {
				out, err = fn(r.Context(), body)
			}
			log := s.log.WithFields(logrus.Fields{"driver": d.Name, "method": path})
			if err != nil {
				log.WithError(err).Debug("docker request failed")
				writeJSON(w, api.StatusCode(err), map[string]string{"Err": err.Error()})
				return
			}
			log.Trace("docker request done")
			writeJSON(w, http.StatusOK, out)
		})
	}
	handle("/Plugin.Activate", func(context.Context, []byte) (any, error) {
		return map[string][]string{"Implements": {"VolumeDriver"}}, nil
	})
	handle("/VolumeDriver.Capabilities", func(context.Context, []byte) (any, error) {
		scope := "local"
		if s.node != "" {
			scope = "global"
		}
		return map[string]any{"Capabilities": map[string]string{"Scope": scope}}, nil
	})
	handleJSON(handle, "/VolumeDriver.Create", func(ctx context.Context, req createRequest) (any, error) {
		return struct{}{}, s.create(ctx, d, req.Name, req.Opts)
	})
	handleJSON(handle, "/VolumeDriver.Remove", func(ctx context.Context, req nameRequest) (any, error) {
		return struct{}{}, s.remove(ctx, d, req.Name)
	})
	handleJSON(handle, "/VolumeDriver.Mount", func(ctx context.Context, req mountRequest) (any, error) {
		mp, err := s.mount(ctx, d, req.Name, req.ID)
		return map[string]string{"Mountpoint": mp}, err
	})
	handleJSON(handle, "/VolumeDriver.Unmount", func(ctx context.Context, req mountRequest) (any, error) {
		return struct{}{}, s.unmount(ctx, d, req.Name, req.ID)
	})
	handleJSON(handle, "/VolumeDriver.Path", func(ctx context.Context, req nameRequest) (any, error) {
		v, err := s.volume(ctx, d, req.Name)
		if err != nil {
			return nil, err
		}
		return map[string]string{"Mountpoint": s.mountpoint(v)}, nil
	})
	handleJSON(handle, "/VolumeDriver.Get", func(ctx context.Context, req nameRequest) (any, error) {
		v, err := s.volume(ctx, d, req.Name)
		if err != nil {
			return nil, err
		}
		return map[string]volumeInfo{"Volume": s.info(v, true)}, nil
	})
	handle("/VolumeDriver.List", func(ctx context.Context, _ []byte) (any, error) {
		vs, err := s.rt.Volumes(ctx, runtime.VolumeFilter{Plugin: d.Plugin})
		if err != nil {
			return nil, err
		}
		out := make([]volumeInfo, 0, len(vs))
		for _, v := range vs {
			out = append(out, s.info(v, false))
		}
		return map[string][]volumeInfo{"Volumes": out}, nil
	})
	return mux
}

// handleJSON registers fn for path with handle, its body decoded into a
// T.
func handleJSON[T any](handle func(string, func(context.Context, []byte) (any, error)), path string, fn func(context.Context, T) (any, error)) {
	handle(path, func(ctx context.Context, body []byte) (any, error) {
		var req T
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		return fn(ctx, req)
	})
}

func decode(body []byte, into any) error {
	if len(body) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("%w: request body is not the protocol's JSON: %s", runtime.ErrInvalid, err.Error())
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// volume returns the volume name of d's plugin.
func (s *Server) volume(ctx context.Context, d runtime.DockerDriver, name string) (runtime.Volume, error) {
	if err := runtime.ValidateID("Name", name); err != nil {
		return runtime.Volume{}, err
	}
	v, err := s.rt.Volume(ctx, name)
	if err != nil {
		return v, err
	}
	if v.Plugin != d.Plugin {
		// Not found, as the engines take it: Docker asks every driver
		// for a volume it does not know.
		return v, fmt.Errorf("%w: volume %q is not a volume of driver %q: its plugin is %q, not %q", runtime.ErrNotFound, name, d.Name, v.Plugin, d.Plugin)
	}
	return v, nil
}

// ours reports whether c is a claim made by a Mount on this host.
func (s *Server) ours(c runtime.Claim) bool {
	return (c.Host == "" || c.Host == s.node) && strings.HasPrefix(c.Alloc, AllocPrefix)
}

// mountpoint is where v is published on this host for the engines: the
// target path of a published claim made by a Mount; "" when none is.
func (s *Server) mountpoint(v runtime.Volume) string {
	for _, c := range v.Claims {
		if c.State == runtime.ClaimPublished && s.ours(c) {
			return c.TargetPath
		}
	}
	return ""
}

// info is v as Get and List show it; Get adds its status.
func (s *Server) info(v runtime.Volume, status bool) volumeInfo {
	vi := volumeInfo{Name: v.ID, Mountpoint: s.mountpoint(v)}
	if !v.CreatedAt.IsZero() {
		vi.CreatedAt = v.CreatedAt.UTC().Format(time.RFC3339)
	}
	if status {
		st := map[string]any{
			"plugin": v.Plugin, "external_id": v.ExternalID, "created": v.Created,
			"claims": len(v.Claims), "past_claims": len(v.PastClaims),
		}
		if len(v.Capabilities) > 0 {
			st["access_mode"], st["attachment_mode"] = v.Capabilities[0].AccessMode, v.Capabilities[0].AttachmentMode
		}
		if v.CapacityBytes > 0 {
			st["capacity_bytes"] = v.CapacityBytes
		}
		var hosts []string
		for _, c := range v.Claims {
			if c.Host != "" {
				hosts = append(hosts, c.Host)
			}
		}
		if len(hosts) > 0 {
			st["hosts"] = hosts
		}
		vi.Status = st
	}
	return vi
}

// create makes or registers volume name. A volume of the driver's plugin
// that exists already is left as it is.
func (s *Server) create(ctx context.Context, d runtime.DockerDriver, name string, opts map[string]string) error {
	if err := runtime.ValidateID("Name", name); err != nil {
		return err
	}
	spec, err := createSpec(d, name, opts)
	if err != nil {
		return err
	}
	defer s.lock(name)()
	switch v, err := s.rt.Volume(ctx, name); {
	case err == nil && v.Plugin != d.Plugin:
		return fmt.Errorf("%w: volume %q exists, of plugin %q, not of driver %q's plugin %q", runtime.ErrConflict, name, v.Plugin, d.Name, d.Plugin)
	case err == nil:
		return nil
	case !errors.Is(err, runtime.ErrNotFound):
		return err
	}
	if spec.ExternalID != "" {
		_, err = s.rt.RegisterVolume(ctx, name, spec.VolumeSpec)
	} else {
		_, err = s.rt.CreateVolume(ctx, spec)
	}
	if err == nil {
		s.log.WithFields(logrus.Fields{"driver": d.Name, "volume": name, "registered": spec.ExternalID != ""}).Info("docker volume created")
	}
	return err
}

// claimFor is the claim a Mount of v by alloc makes: with the volume's
// first capability, a write claim unless that is read-only.
func claimFor(v runtime.Volume, alloc string) (runtime.ClaimRequest, error) {
	if len(v.Capabilities) == 0 {
		return runtime.ClaimRequest{}, fmt.Errorf("%w: volume %q has no capability", runtime.ErrConflict, v.ID)
	}
	c := v.Capabilities[0]
	mode := runtime.ModeWrite
	if am, err := csi.ParseAccessMode(c.AccessMode); err == nil && am.ReadOnly() {
		mode = runtime.ModeRead
	}
	return runtime.ClaimRequest{Alloc: alloc, Mode: mode, AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode}, nil
}

// mount counts a reference of mount ID id and answers with the target
// path of its claim, once it is published.
func (s *Server) mount(ctx context.Context, d runtime.DockerDriver, name, id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%w: Mount without an ID", runtime.ErrInvalid)
	}
	defer s.lock(name)()
	v, err := s.volume(ctx, d, name)
	if err != nil {
		return "", err
	}
	k := mountKey{name, id}
	alloc := AllocFor(id)
	tookOver := false
	if r, ok := s.book.get(k); ok {
		alloc = r.Alloc
	} else {
		// A new mount ID takes over the claim of another one waiting out
		// its grace period: the next container after one that ended, or
		// the container's own Mount after Docker's copy of the image's
		// content, which mounts with an ID of its own. No RPC is sent.
		for _, e := range s.book.entries(name) {
			if e.Refs == 0 {
				s.cancelRelease(mountKey{name, e.ID})
				moved, err := s.book.takeOver(mountKey{name, e.ID}, k, d.Name)
				if err != nil {
					s.scheduleRelease(mountKey{name, e.ID})
					return "", err
				}
				alloc, tookOver = moved.Alloc, true
				s.log.WithFields(logrus.Fields{"volume": name, "alloc": alloc}).Debug("docker mount took over a claim in its grace period")
				break
			}
		}
	}
	req, err := claimFor(v, alloc)
	if err != nil {
		return "", err
	}
	n := 1 // a claim taken over has its reference counted
	if !tookOver {
		if n, _, err = s.book.add(k, d.Name, 1); err != nil {
			return "", err
		}
	}
	s.cancelRelease(k)
	// The teardown of another claim of a Mount on this host (released
	// by the reconciler, or by an Unmount's grace period) is waited for
	// rather than refused as a conflict.
	tearingDown := false
	for _, c := range v.PastClaims {
		tearingDown = tearingDown || s.ours(c)
	}
	var c runtime.Claim
	if tearingDown {
		c, err = s.rt.ClaimWait(ctx, name, req, teardownWait)
	} else {
		c, err = s.rt.Claim(ctx, name, req)
	}
	if err != nil {
		// The claim may have been made before it failed; undo this
		// reference and, with none left, release it.
		if left, _, berr := s.book.add(k, d.Name, -1); berr == nil && left == 0 {
			s.releaseLocked(context.WithoutCancel(ctx), k, "its Mount failed")
		}
		return "", err
	}
	s.log.WithFields(logrus.Fields{"driver": d.Name, "volume": name, "alloc": req.Alloc, "references": n}).Debug("docker mount")
	return c.TargetPath, nil
}

// unmount drops a reference of mount ID id; the last one releases the
// claim after the grace period.
func (s *Server) unmount(ctx context.Context, d runtime.DockerDriver, name, id string) error {
	if err := runtime.ValidateID("Name", name); err != nil {
		return err
	}
	defer s.lock(name)()
	k := mountKey{name, id}
	n, known, err := s.book.add(k, d.Name, -1)
	if err != nil || !known || n > 0 {
		return err
	}
	if s.cfg.UnmountGrace <= 0 {
		return s.releaseLocked(ctx, k, "its last Unmount came")
	}
	s.scheduleRelease(k)
	return nil
}

// scheduleRelease releases k's claim after the grace period, unless a
// Mount of it comes first.
func (s *Server) scheduleRelease(k mountKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	if t, ok := s.timers[k]; ok && t.Stop() {
		s.wg.Done()
	}
	s.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(s.cfg.UnmountGrace, func() {
		defer s.wg.Done()
		s.mu.Lock()
		if s.timers[k] == t {
			delete(s.timers, k)
		}
		s.mu.Unlock()
		unlock := s.lock(k.volume)
		defer unlock()
		if r, ok := s.book.get(k); !ok || r.Refs > 0 {
			return
		}
		ctx, cancel := context.WithTimeout(s.ctx, removeWait)
		defer cancel()
		if err := s.releaseLocked(ctx, k, "its last Unmount came"); err != nil {
			s.log.WithError(err).WithFields(logrus.Fields{"volume": k.volume, "mount_id": k.id}).Warn("docker: release failed; tried again later")
			s.scheduleRelease(k)
		}
	})
	s.timers[k] = t
}

// cancelRelease stops k's pending release.
func (s *Server) cancelRelease(k mountKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.timers[k]; ok {
		if t.Stop() {
			s.wg.Done()
		}
		delete(s.timers, k)
	}
}

// releaseLocked releases k's claim and forgets k. The caller holds k's
// volume lock.
func (s *Server) releaseLocked(ctx context.Context, k mountKey, why string) error {
	alloc := AllocFor(k.id)
	if r, ok := s.book.get(k); ok {
		alloc = r.Alloc
	}
	if _, err := s.rt.Release(ctx, k.volume, alloc); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return err
	}
	s.log.WithFields(logrus.Fields{"volume": k.volume, "alloc": alloc}).Infof("docker mount released: %s", why)
	return s.book.remove(k)
}

// remove deletes (or deregisters) volume name once no mount holds it.
func (s *Server) remove(ctx context.Context, d runtime.DockerDriver, name string) error {
	if err := runtime.ValidateID("Name", name); err != nil {
		return err
	}
	defer s.lock(name)()
	v, err := s.volume(ctx, d, name)
	if errors.Is(err, runtime.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var held []string
	for _, e := range s.book.entries(name) {
		if e.Refs > 0 {
			held = append(held, e.Alloc)
			continue
		}
		s.cancelRelease(mountKey{name, e.ID})
		if err := s.releaseLocked(ctx, mountKey{name, e.ID}, "its volume is removed"); err != nil {
			return err
		}
	}
	if len(held) > 0 {
		return fmt.Errorf("%w: volume %q is in use: mounted for %d containers (claims %v)", runtime.ErrConflict, name, len(held), held)
	}
	if v, err = s.awaitTeardown(ctx, name); err != nil {
		return err
	}
	if err := s.rt.DeleteVolume(ctx, name, v.Created); err != nil {
		return err
	}
	s.log.WithFields(logrus.Fields{"driver": d.Name, "volume": name, "deleted": v.Created}).Info("docker volume removed")
	return nil
}

// awaitTeardown waits until the volume has no past claims of this
// host's Mounts, whose teardown would make its deletion a conflict.
func (s *Server) awaitTeardown(ctx context.Context, name string) (runtime.Volume, error) {
	ctx, cancel := context.WithTimeout(ctx, removeWait)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		v, err := s.rt.Volume(ctx, name)
		if err != nil {
			return v, err
		}
		busy := false
		for _, c := range v.PastClaims {
			busy = busy || s.ours(c)
		}
		if !busy {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%w: volume %q: its released claims are still being torn down", runtime.ErrConflict, name)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}
