package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// gracefulStopTimeout bounds how long Stop waits for in-flight RPCs before
// it closes their connections.
const gracefulStopTimeout = 10 * time.Second

// Plugin is the example CSI plugin: identity, controller and node services
// over one gRPC server, with its state in Config.StateDir.
//
// A Plugin is safe for concurrent use. Every RPC that reads or changes
// volumes holds the state lock for its whole run, mount calls included,
// so the state file and the mount table always change together: a mutex,
// and with Config.SharedDir also an flock that the instances sharing it
// take in turn.
type Plugin struct {
	cfg    Config
	log    *logrus.Entry
	mnt    mounter
	server *grpc.Server
	lock   *os.File
	// dataDir holds the volumes, snapshots and state file: cfg.SharedDir
	// or cfg.StateDir.
	dataDir string
	// shared is the open cfg.SharedDir/lock file; nil without SharedDir.
	shared *os.File

	stopOnce sync.Once
	stopped  chan struct{}

	mu    sync.Mutex
	st    *state // guarded by mu (and the shared flock)
	stale error  // guarded by mu: why the shared state could not be read
}

// New checks cfg, creates StateDir, takes its lock and loads its state.
// The caller must call Stop to release the lock, even without Serve.
func New(cfg Config) (*Plugin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.FUSE {
		if err := checkFUSE(); err != nil {
			return nil, err
		}
	}
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("%w: node_id is empty and the hostname is unknown", ErrInvalidConfig)
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("%w: state_dir: %w", ErrInvalidConfig, err)
	}
	cfg.StateDir = dir
	if err := os.MkdirAll(filepath.Join(dir, volumesDir), 0o750); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ConditionsDir), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	lock, err := lockStateDir(dir)
	if err != nil {
		return nil, err
	}
	p := &Plugin{
		cfg:     cfg,
		log:     cfg.Logger.WithField("plugin", cfg.Name),
		lock:    lock,
		dataDir: dir,
		stopped: make(chan struct{}),
	}
	if cfg.SharedDir != "" {
		if err := p.joinShared(); err != nil {
			lock.Close()
			return nil, err
		}
	} else if p.st, err = loadState(dir); err != nil {
		lock.Close()
		return nil, err
	}
	switch {
	case cfg.FUSE:
		p.mnt, p.cfg.MountMode = newFUSEMounter("/proc/self/mountinfo", p.log, cfg.FUSEFailDeadUnmount), MountModeBind
	case cfg.MountMode == MountModeBind:
		p.mnt = bindMounter{mountinfo: "/proc/self/mountinfo"}
	case cfg.MountMode == MountModeSymlink:
		p.mnt = symlinkMounter{}
	default:
		if os.Geteuid() == 0 {
			p.mnt, p.cfg.MountMode = bindMounter{mountinfo: "/proc/self/mountinfo"}, MountModeBind
		} else {
			p.mnt, p.cfg.MountMode = symlinkMounter{}, MountModeSymlink
		}
	}
	if cfg.LoseMountsOnStart {
		p.loseMounts()
	}
	p.server = grpc.NewServer(grpc.UnaryInterceptor(p.logCall))
	csipb.RegisterIdentityServer(p.server, &identityServer{p: p})
	csipb.RegisterControllerServer(p.server, &controllerServer{p: p})
	csipb.RegisterNodeServer(p.server, &nodeServer{p: p})
	return p, nil
}

// loseMounts undoes every recorded publication, then every staging, and
// keeps the records (see Config.LoseMountsOnStart). Failures are logged.
func (p *Plugin) loseMounts() {
	n := 0
	for _, v := range p.st.Volumes {
		for target := range v.Targets {
			if err := p.mnt.unpublish(target); err != nil {
				p.log.WithError(err).WithField("volume", v.ID).Warn("lose mounts on start: unpublish")
				continue
			}
			n++
		}
	}
	for _, v := range p.st.Volumes {
		for staging := range v.Staged {
			if err := p.mnt.unstage(staging); err != nil {
				p.log.WithError(err).WithField("volume", v.ID).Warn("lose mounts on start: unstage")
				continue
			}
			n++
		}
	}
	p.log.WithField("undone", n).Warn("lost every staging and publication on start, as asked (the records are kept)")
}

// Config returns the plugin's configuration with defaults applied (and
// MountModeAuto resolved to the mode in use).
func (p *Plugin) Config() Config { return p.cfg }

// Serve answers CSI RPCs on l until Stop; it returns nil after Stop, or the
// listener's error. It takes ownership of l.
func (p *Plugin) Serve(l net.Listener) error {
	select {
	case <-p.stopped:
		l.Close()
		return ErrStopped
	default:
	}
	err := p.server.Serve(l)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stop stops serving, waiting up to 10 s for in-flight RPCs, and releases
// the state dir lock. In FUSE mode it then ends the FUSE servers as the
// process's exit would: their mounts stay, dead (see Config.FUSE). It is
// idempotent and returns when Serve has returned.
func (p *Plugin) Stop() {
	p.stopOnce.Do(func() {
		close(p.stopped)
		done := make(chan struct{})
		go func() {
			p.server.GracefulStop()
			close(done)
		}()
		t := time.NewTimer(gracefulStopTimeout)
		select {
		case <-done:
		case <-t.C:
			p.log.Warn("in-flight RPCs did not finish in time; closing connections")
			p.server.Stop()
			<-done
		}
		t.Stop()
		if f, ok := p.mnt.(*fuseMounter); ok {
			f.close()
		}
		p.mu.Lock()
		p.lock.Close()
		if p.shared != nil {
			p.shared.Close()
		}
		p.mu.Unlock()
	})
}

// Run serves cfg.Endpoint until ctx is done, then stops gracefully and
// removes the socket. A stale socket left by a dead plugin is replaced;
// one that still answers is ErrEndpointInUse. Run returns nil after ctx is
// done, or the error that stopped it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Endpoint == "" {
		return fmt.Errorf("%w: endpoint is required", ErrInvalidConfig)
	}
	p, err := New(cfg)
	if err != nil {
		return err
	}
	defer p.Stop()
	path, err := ParseEndpoint(p.cfg.Endpoint)
	if err != nil {
		return err
	}
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	p.log.WithFields(logrus.Fields{
		"endpoint":   path,
		"node_id":    p.cfg.NodeID,
		"state_dir":  p.cfg.StateDir,
		"shared_dir": p.cfg.SharedDir,
		"mount_mode": p.cfg.MountMode,
		"fuse":       p.cfg.FUSE,
	}).Info("serving")

	errc := make(chan error, 1)
	go func() { errc <- p.Serve(l) }()
	select {
	case <-ctx.Done():
		p.Stop()
		<-errc
		p.log.Info("stopped")
		return nil
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	}
}

// listenUnix listens on a unix socket at path (mode 0600), first removing a
// socket file that nobody answers on.
func listenUnix(path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("endpoint: %w", err)
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("%w: %s exists and is not a socket", ErrInvalidConfig, path)
	default:
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrEndpointInUse, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("endpoint: probe existing socket: %w", err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("endpoint: remove stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	return l, nil
}

// logCall logs every RPC with its method, volume id, gRPC code and
// duration. It never logs a request or response: they carry secrets and
// mount flags.
func (p *Plugin) logCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	fields := logrus.Fields{
		"method":   filepath.Base(info.FullMethod),
		"code":     status.Code(err).String(),
		"duration": time.Since(start),
	}
	if v, ok := req.(interface{ GetVolumeId() string }); ok && v.GetVolumeId() != "" {
		fields["volume"] = v.GetVolumeId()
	}
	entry := p.log.WithFields(fields)
	switch status.Code(err) {
	case codes.OK:
		entry.Debug("call")
	case codes.Internal, codes.Unknown, codes.Unavailable:
		entry.WithField("error", status.Convert(err).Message()).Warn("call failed")
	default: // the caller's mistake or an expected answer (NotFound on cleanup)
		entry.WithField("error", status.Convert(err).Message()).Info("call failed")
	}
	return resp, err
}
