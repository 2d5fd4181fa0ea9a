package container

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/sirupsen/logrus"
)

// Labels on every container the agent creates.
const (
	// LabelAlloc is the allocation ID.
	LabelAlloc = "io.csiactor.alloc"
	// LabelDataDir is the data dir of the agent that created it.
	LabelDataDir = "io.csiactor.data_dir"
	// LabelSpec is a digest of what the container was created with (see
	// Launcher.SpecDigest): a container whose digest differs from the
	// allocation's spec is never adopted, but replaced.
	LabelSpec = "io.csiactor.spec"
)

// Errors of the launcher.
var (
	// ErrEngineDown: the engine's API socket does not answer.
	ErrEngineDown = errors.New("engine not reachable")
	// ErrImageMissing: the engine does not hold the image and the pull
	// policy is never.
	ErrImageMissing = errors.New("image missing")
)

// Config configures a Launcher.
type Config struct {
	// DockerSocket and PodmanSocket are the engines' API sockets; empty
	// means DefaultDockerSocket and DefaultPodmanSocket.
	DockerSocket string
	PodmanSocket string
	// DataDir is the agent's data dir, the value of LabelDataDir.
	// Required.
	DataDir string
	// VolumesDir is where the agent stages and publishes volumes; it is
	// bound into every container at the same path with rshared
	// propagation, and made a shared mount point first (a bind of itself)
	// where it is not one. Empty binds nothing.
	VolumesDir string
}

// Launcher creates, adopts and removes plugin containers. It is safe for
// concurrent use; Close it when done.
type Launcher struct {
	cfg     Config
	mu      sync.Mutex
	clients map[string]*client.Client // guarded by mu
}

// NewLauncher returns a launcher for cfg.
func NewLauncher(cfg Config) (*Launcher, error) {
	if cfg.DockerSocket == "" {
		cfg.DockerSocket = DefaultDockerSocket
	}
	if cfg.PodmanSocket == "" {
		cfg.PodmanSocket = DefaultPodmanSocket
	}
	if !filepath.IsAbs(cfg.DataDir) {
		return nil, fmt.Errorf("container launcher: data dir %q is not absolute", cfg.DataDir)
	}
	return &Launcher{cfg: cfg, clients: map[string]*client.Client{}}, nil
}

// Close closes the engine clients.
func (l *Launcher) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, c := range l.clients {
		_ = c.Close()
		delete(l.clients, k)
	}
}

// Socket returns the API socket of engine.
func (l *Launcher) Socket(engine string) string {
	if engine == Podman {
		return l.cfg.PodmanSocket
	}
	return l.cfg.DockerSocket
}

func (l *Launcher) client(engine string) (*client.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.clients[engine]; c != nil {
		return c, nil
	}
	// The API version is negotiated with the engine (down to 1.40).
	c, err := client.New(client.WithHost("unix://" + l.Socket(engine)))
	if err != nil {
		return nil, fmt.Errorf("%s engine client: %w", engine, err)
	}
	l.clients[engine] = c
	return c, nil
}

// engineErr describes err from engine: an unreachable engine is
// ErrEngineDown, naming the engine and its socket.
func (l *Launcher) engineErr(engine, what string, err error) error {
	var op *net.OpError
	if client.IsErrConnectionFailed(err) || errors.As(err, &op) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("%w: %s engine at %s: %s: %w", ErrEngineDown, engine, l.Socket(engine), what, err)
	}
	return fmt.Errorf("%s engine: %s: %w", engine, what, err)
}

// RunSpec says how to run one plugin container.
type RunSpec struct {
	// Alloc is the allocation ID; Type its type ("controller", "node" or
	// "monolith"), which chooses the default capabilities.
	Alloc string
	Type  string
	Image Image
	// Args are the container's arguments, placeholders replaced.
	Args []string
	// Env is the container's environment, as "KEY=value" (CSI_ENDPOINT
	// included).
	Env []string
	// SocketDir is the plugin's socket directory, bound at the same path.
	SocketDir string
	// OutputDir receives the container's output (see proc.Sink).
	OutputDir string
}

// Name returns the name of the container for alloc: unique per agent
// (data dir), so two agents on one engine never collide.
func (l *Launcher) Name(alloc string) string {
	h := sha256.Sum256([]byte(l.cfg.DataDir))
	return "csiactor-" + alloc + "-" + hex.EncodeToString(h[:4])
}

// capabilities returns the capabilities to add: the image's, or the
// default for typ.
func capabilities(im Image, typ string) []string {
	caps := im.Capabilities
	if caps == nil && typ != "controller" {
		caps = []string{"SYS_ADMIN"}
	}
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		out = append(out, "CAP_"+strings.TrimPrefix(strings.ToUpper(c), "CAP_"))
	}
	return out
}

// hostConfig is the container's host configuration for s.
func (l *Launcher) hostConfig(s RunSpec) *container.HostConfig {
	binds := []string{"/dev:/dev", s.SocketDir + ":" + s.SocketDir}
	if l.cfg.VolumesDir != "" {
		binds = append(binds, l.cfg.VolumesDir+":"+l.cfg.VolumesDir+":rshared")
	}
	for _, m := range s.Image.Mounts {
		b := m.Source + ":" + m.Target
		if m.ReadOnly {
			b += ":ro"
		}
		binds = append(binds, b)
	}
	hc := &container.HostConfig{
		Binds:       binds,
		NetworkMode: "none",
		CapAdd:      capabilities(s.Image, s.Type),
		Privileged:  s.Image.Privileged,
		LogConfig:   container.LogConfig{},
	}
	if s.Image.HostNetwork {
		hc.NetworkMode = "host"
	}
	if s.Image.HostPID {
		hc.PidMode = "host"
	}
	if len(hc.CapAdd) > 0 || hc.Privileged {
		hc.SecurityOpt = []string{"seccomp=unconfined", "apparmor=unconfined"}
	}
	for _, d := range s.Image.Devices {
		hc.Devices = append(hc.Devices, container.DeviceMapping{PathOnHost: d, PathInContainer: d, CgroupPermissions: "rwm"})
	}
	return hc
}

// Start makes sure the engine holds the image (by its pull policy),
// removes any container of the allocation this agent's data dir left
// (so two never run), then creates and starts the container.
func (l *Launcher) Start(ctx context.Context, s RunSpec, log *logrus.Entry) (*Container, error) {
	engine := s.Image.EngineName()
	c, err := l.client(engine)
	if err != nil {
		return nil, err
	}
	if err := l.ensureImage(ctx, c, s.Image, log); err != nil {
		return nil, err
	}
	if l.cfg.VolumesDir != "" {
		if err := ensureShared(l.cfg.VolumesDir); err != nil {
			return nil, err
		}
	}
	if err := l.RemoveAll(ctx, engine, s.Alloc, log); err != nil {
		return nil, err
	}
	cfg, hc := l.createConfig(s)
	created, err := c.ContainerCreate(ctx, client.ContainerCreateOptions{Config: cfg, HostConfig: hc, Name: l.Name(s.Alloc)})
	if err != nil {
		return nil, l.engineErr(engine, "create container", err)
	}
	if _, err := c.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, _ = c.ContainerRemove(rctx, created.ID, client.ContainerRemoveOptions{Force: true})
		cancel()
		return nil, l.engineErr(engine, "start container", err)
	}
	return l.watch(ctx, engine, created.ID, s.OutputDir, log, false)
}

// createConfig returns the configurations s's container is created with,
// labelled with the allocation, the data dir and their digest.
func (l *Launcher) createConfig(s RunSpec) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image:  s.Image.Image,
		Cmd:    s.Args,
		Env:    s.Env,
		Labels: map[string]string{LabelAlloc: s.Alloc, LabelDataDir: l.cfg.DataDir},
	}
	if len(s.Args) == 0 {
		cfg.Cmd = nil
	}
	hc := l.hostConfig(s)
	// Marshalling these types cannot fail.
	b, _ := json.Marshal(struct {
		C *container.Config
		H *container.HostConfig
	}{cfg, hc})
	h := sha256.Sum256(b)
	cfg.Labels[LabelSpec] = hex.EncodeToString(h[:])
	return cfg, hc
}

// SpecDigest returns the digest of what s's container is created with
// (the value of LabelSpec): the image reference, arguments, environment,
// capabilities, devices, mounts and namespaces. Found.Spec of a container
// created for another spec differs.
func (l *Launcher) SpecDigest(s RunSpec) string {
	cfg, _ := l.createConfig(s)
	return cfg.Labels[LabelSpec]
}

func (l *Launcher) ensureImage(ctx context.Context, c *client.Client, im Image, log *logrus.Entry) error {
	engine := im.EngineName()
	policy := im.PullPolicy()
	if policy != PullAlways {
		_, err := c.ImageInspect(ctx, im.Image)
		switch {
		case err == nil:
			return nil
		case !cerrdefs.IsNotFound(err):
			return l.engineErr(engine, "inspect image", err)
		case policy == PullNever:
			return fmt.Errorf("%w: the %s engine at %s does not hold image %q and pull is never", ErrImageMissing, engine, l.Socket(engine), im.Image)
		}
	}
	log.WithField("image", im.Image).Info("pulling the plugin's image")
	r, err := c.ImagePull(ctx, im.Image, client.ImagePullOptions{})
	if err != nil {
		return l.engineErr(engine, "pull image "+im.Image, err)
	}
	defer func() { _ = r.Close() }()
	if err := r.Wait(ctx); err != nil {
		return l.engineErr(engine, "pull image "+im.Image, err)
	}
	return nil
}

// HasImage reports whether engine holds im's image, for a check at
// registration: an error only when the engine answers that it does not
// (ErrImageMissing) and the pull policy is never; an unreachable engine is
// no error here (the start retries).
func (l *Launcher) HasImage(ctx context.Context, im Image) error {
	if im.PullPolicy() != PullNever {
		return nil
	}
	c, err := l.client(im.EngineName())
	if err != nil {
		return err
	}
	if _, err := c.ImageInspect(ctx, im.Image); cerrdefs.IsNotFound(err) {
		return fmt.Errorf("%w: the %s engine at %s does not hold image %q and pull is never", ErrImageMissing, im.EngineName(), l.Socket(im.EngineName()), im.Image)
	}
	return nil
}

// Found is a container of an allocation found by its labels.
type Found struct {
	ID      string
	Running bool
	// Spec is its LabelSpec: SpecDigest of the spec it was created for
	// ("" for a container created before the label existed).
	Spec string
}

// Find lists the containers of alloc (labelled with this launcher's data
// dir) on engine, running or not.
func (l *Launcher) Find(ctx context.Context, engine, alloc string) ([]Found, error) {
	c, err := l.client(engine)
	if err != nil {
		return nil, err
	}
	res, err := c.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: client.Filters{}.Add("label", LabelAlloc+"="+alloc, LabelDataDir+"="+l.cfg.DataDir)})
	if err != nil {
		return nil, l.engineErr(engine, "list containers", err)
	}
	var out []Found
	for _, s := range res.Items {
		// Filters with two label values match containers with both.
		if s.Labels[LabelAlloc] != alloc || s.Labels[LabelDataDir] != l.cfg.DataDir {
			continue
		}
		out = append(out, Found{ID: s.ID, Running: s.State == container.StateRunning, Spec: s.Labels[LabelSpec]})
	}
	return out, nil
}

// RemoveAll force-removes every container of alloc on engine.
func (l *Launcher) RemoveAll(ctx context.Context, engine, alloc string, log *logrus.Entry) error {
	found, err := l.Find(ctx, engine, alloc)
	if err != nil {
		return err
	}
	for _, f := range found {
		if err := l.remove(ctx, engine, f.ID); err != nil {
			return err
		}
		e := log.WithField("container", short(f.ID))
		if f.Running {
			e.Warn("removed a running container of the allocation")
		} else {
			e.Info("removed an exited container of the allocation")
		}
	}
	return nil
}

func (l *Launcher) remove(ctx context.Context, engine, id string) error {
	c, err := l.client(engine)
	if err != nil {
		return err
	}
	if _, err := c.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return l.engineErr(engine, "remove container "+short(id), err)
	}
	return nil
}

// Adopt takes over the running container id of engine that a previous
// agent left.
func (l *Launcher) Adopt(ctx context.Context, engine, id, outputDir string, log *logrus.Entry) (*Container, error) {
	return l.watch(ctx, engine, id, outputDir, log, true)
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// watch inspects the started or adopted container id and starts watching
// it.
func (l *Launcher) watch(ctx context.Context, engine, id, outputDir string, log *logrus.Entry, adopted bool) (*Container, error) {
	c, err := l.client(engine)
	if err != nil {
		return nil, err
	}
	ins, err := c.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return nil, l.engineErr(engine, "inspect container "+short(id), err)
	}
	st := ins.Container.State
	if st == nil || !st.Running {
		return nil, fmt.Errorf("%s engine: container %s is not running", engine, short(id))
	}
	started, _ := time.Parse(time.RFC3339Nano, st.StartedAt)
	if started.IsZero() {
		started = time.Now()
	}
	wctx, cancel := context.WithCancel(context.Background())
	ct := &Container{
		l: l, c: c, engine: engine, id: id, imageID: ins.Container.Image, started: started, adopted: adopted,
		log: log, ctx: wctx, cancel: cancel, exited: make(chan struct{}), copied: make(chan struct{}),
	}
	cctx, stopCopy := context.WithCancel(wctx)
	ct.stopCopy = stopCopy
	ct.wg.Add(2)
	go ct.copyOutput(cctx, outputDir)
	go ct.waitExit()
	return ct, nil
}

// Container is a running plugin container being watched. Its methods are
// safe for concurrent use.
type Container struct {
	l       *Launcher
	c       *client.Client
	engine  string
	id      string
	imageID string
	started time.Time
	adopted bool
	log     *logrus.Entry

	ctx    context.Context // ends the watcher and the log copier
	cancel context.CancelFunc
	wg     sync.WaitGroup
	exited chan struct{}
	// The log copier ends when stopCopy is called or the container's
	// output ends; copied is closed then.
	stopCopy context.CancelFunc
	copied   chan struct{}

	mu     sync.Mutex
	status string // guarded by mu; set before exited is closed
	down   string // guarded by mu; why the engine does not answer, "" when it does
}

// ID returns the container ID.
func (ct *Container) ID() string { return ct.id }

// Engine returns the engine's name.
func (ct *Container) Engine() string { return ct.engine }

// ImageID returns the ID (digest) of the image the container runs.
func (ct *Container) ImageID() string { return ct.imageID }

// Started returns when the container started.
func (ct *Container) Started() time.Time { return ct.started }

// Exited is closed when the container stopped or was removed.
func (ct *Container) Exited() <-chan struct{} { return ct.exited }

// Status says how the container ended ("exit status 2", "killed
// (exit status 137)", "container removed"); empty before Exited.
func (ct *Container) Status() string {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.status
}

// EngineDown says why the engine does not answer while the container is
// watched ("" when it does).
func (ct *Container) EngineDown() string {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.down
}

func (ct *Container) setDown(s string) {
	ct.mu.Lock()
	ct.down = s
	ct.mu.Unlock()
}

// waitExit waits for the container to stop, riding out an engine that
// goes away: it retries until the engine answers again and says the
// container stopped or is gone.
func (ct *Container) waitExit() {
	defer ct.wg.Done()
	delay := 100 * time.Millisecond
	for {
		res := ct.c.ContainerWait(ct.ctx, ct.id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
		select {
		case r := <-res.Result:
			ct.finish(r.StatusCode, "")
			return
		case err := <-res.Error:
			if ct.ctx.Err() != nil {
				return
			}
			if cerrdefs.IsNotFound(err) {
				ct.finish(-1, "container removed")
				return
			}
			// The engine went away (or the wait broke): look again once
			// it answers.
			down := ct.l.engineErr(ct.engine, "wait for container "+short(ct.id), err)
			ct.setDown(down.Error())
			// The error names the engine and its socket.
			ct.log.WithError(down).WithField("container", short(ct.id)).Warn("lost the container engine; retrying")
		case <-ct.ctx.Done():
			return
		}
		for {
			select {
			case <-ct.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 5*time.Second)
			ins, err := ct.c.ContainerInspect(ct.ctx, ct.id, client.ContainerInspectOptions{})
			switch {
			case ct.ctx.Err() != nil:
				return
			case cerrdefs.IsNotFound(err):
				ct.finish(-1, "container removed")
				return
			case err != nil:
				ct.setDown(ct.l.engineErr(ct.engine, "inspect container "+short(ct.id), err).Error())
				continue
			}
			ct.setDown("")
			if st := ins.Container.State; st == nil || !st.Running {
				code := int64(-1)
				if st != nil {
					code = int64(st.ExitCode)
				}
				ct.finish(code, "")
				return
			}
			delay = 100 * time.Millisecond
			break
		}
	}
}

func (ct *Container) finish(code int64, why string) {
	ct.mu.Lock()
	switch {
	case why != "":
		ct.status = why
	case code == 137:
		ct.status = "killed (exit status 137)"
	default:
		ct.status = fmt.Sprintf("exit status %d", code)
	}
	ct.mu.Unlock()
	// The engine has the container's last lines: let the copier take
	// them before the exit is told (a new container's copier appends to
	// the same files).
	select {
	case <-ct.copied:
	case <-time.After(10 * time.Second):
		ct.stopCopy()
		<-ct.copied
	}
	close(ct.exited)
}

// Kill sends SIGKILL to the container; its exit shows in Exited.
func (ct *Container) Kill(ctx context.Context) error {
	if _, err := ct.c.ContainerKill(ctx, ct.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil && !cerrdefs.IsNotFound(err) {
		return ct.l.engineErr(ct.engine, "kill container "+short(ct.id), err)
	}
	return nil
}

// Stop stops the container (SIGTERM, SIGKILL after grace), removes it and
// stops watching it.
func (ct *Container) Stop(ctx context.Context, grace time.Duration) error {
	secs := int(grace.Round(time.Second) / time.Second)
	_, err := ct.c.ContainerStop(ctx, ct.id, client.ContainerStopOptions{Timeout: &secs})
	if err != nil && !cerrdefs.IsNotFound(err) {
		err = ct.l.engineErr(ct.engine, "stop container "+short(ct.id), err)
	} else {
		err = ct.l.remove(ctx, ct.engine, ct.id)
	}
	ct.Detach()
	return err
}

// Detach stops watching the container and copying its output, and leaves
// it running.
func (ct *Container) Detach() {
	ct.cancel()
	ct.wg.Wait()
}

// Adopted reports whether the container was adopted rather than started.
func (ct *Container) Adopted() bool { return ct.adopted }
