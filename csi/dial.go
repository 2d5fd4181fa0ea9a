package csi

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/internal/kinderr"
)

const (
	// DefaultRPCTimeout is the timeout of every RPC other than Probe when
	// WithRPCTimeout is not given. Publish and stage calls on real storage
	// can take tens of seconds; a minute leaves room without hanging a
	// volume forever.
	DefaultRPCTimeout = time.Minute
	// DefaultProbeTimeout is the timeout of Probe when WithProbeTimeout is
	// not given. A healthy plugin answers Probe at once.
	DefaultProbeTimeout = 5 * time.Second
	// DefaultPluginName is the plugin label used in logs and metrics when
	// WithPluginName is not given.
	DefaultPluginName = "unknown"
	// MaxSocketPathLen is the longest unix socket path the kernel accepts
	// (sun_path is 108 bytes including the terminating NUL).
	MaxSocketPathLen = 107
)

// Option configures Dial.
type Option func(*options)

type options struct {
	rpcTimeout   time.Duration
	probeTimeout time.Duration
	log          *logrus.Entry
	metrics      *Metrics
	plugin       string
	onCallEnd    func(CallEnd)
}

// WithRPCTimeout sets the timeout applied to every RPC except Probe. Zero
// means DefaultRPCTimeout; a negative value makes Dial fail.
func WithRPCTimeout(d time.Duration) Option { return func(o *options) { o.rpcTimeout = d } }

// WithProbeTimeout sets the timeout applied to Probe. Zero means
// DefaultProbeTimeout; a negative value makes Dial fail.
func WithProbeTimeout(d time.Duration) Option { return func(o *options) { o.probeTimeout = d } }

// WithLogger sets the logger. Each call is logged at debug level with its
// request and response stripped of secrets and mount flags. Without it the
// client logs nothing.
func WithLogger(l *logrus.Entry) Option { return func(o *options) { o.log = l } }

// WithMetrics makes the client record csiactor_csi_operations_seconds in m.
func WithMetrics(m *Metrics) Option { return func(o *options) { o.metrics = m } }

// WithPluginName sets the plugin label of log lines and metrics.
func WithPluginName(name string) Option { return func(o *options) { o.plugin = name } }

// WithCallObserver makes the client call fn after every RPC ends (the
// typed methods and Invoke alike), on the goroutine that made the call,
// with the method and the error the caller gets. fn must not block: it
// delays the caller.
func WithCallObserver(fn func(CallEnd)) Option { return func(o *options) { o.onCallEnd = fn } }

func buildOptions(opts []Option) (options, error) {
	o := options{}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.rpcTimeout < 0:
		return o, fmt.Errorf("%w: rpc timeout %s is negative", ErrInvalidOption, o.rpcTimeout)
	case o.probeTimeout < 0:
		return o, fmt.Errorf("%w: probe timeout %s is negative", ErrInvalidOption, o.probeTimeout)
	}
	if o.rpcTimeout == 0 {
		o.rpcTimeout = DefaultRPCTimeout
	}
	if o.probeTimeout == 0 {
		o.probeTimeout = DefaultProbeTimeout
	}
	if o.plugin == "" {
		o.plugin = DefaultPluginName
	}
	if o.log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		l.SetLevel(logrus.PanicLevel)
		o.log = logrus.NewEntry(l)
	}
	o.log = o.log.WithField("plugin", o.plugin)
	return o, nil
}

// ParseEndpoint returns the socket path of a plugin endpoint. It accepts
// "unix:///abs/path" and a bare absolute path. Any other scheme, a relative
// or empty path, and a path longer than MaxSocketPathLen bytes are rejected
// with ErrInvalidEndpoint.
func ParseEndpoint(endpoint string) (string, error) {
	path := endpoint
	if scheme, rest, ok := strings.Cut(endpoint, "://"); ok {
		if scheme != "unix" {
			return "", kinderr.Errorf(ErrInvalidEndpoint, "%q: scheme %q is not supported (want unix://)", endpoint, scheme)
		}
		path = rest
	}
	switch {
	case path == "":
		return "", kinderr.Errorf(ErrInvalidEndpoint, "%q: empty socket path", endpoint)
	case !filepath.IsAbs(path):
		return "", kinderr.Errorf(ErrInvalidEndpoint, "%q: socket path %q is not absolute", endpoint, path)
	}
	path = filepath.Clean(path)
	if len(path) > MaxSocketPathLen {
		return "", kinderr.Errorf(ErrInvalidEndpoint,
			"socket path is %d bytes, longer than the %d-byte unix socket limit: %q", len(path), MaxSocketPathLen, path)
	}
	return path, nil
}

// Dial connects to the plugin at endpoint (see ParseEndpoint) and returns a
// Client once the connection is READY. It waits, under ctx, for the socket
// file to appear and for the plugin to accept the connection; when ctx ends
// first, the error wraps ctx.Err(). Without a deadline on ctx, Dial waits
// until the plugin is there.
//
// The Client owns one gRPC connection; Close it when done. After Dial
// returns, gRPC reconnects on its own when the plugin restarts on the same
// socket; State and WaitForStateChange report it.
func Dial(ctx context.Context, endpoint string, opts ...Option) (Client, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := waitForSocket(ctx, path); err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}

	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	cc, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithDisableRetry(), // RetryCall and Classify are the only retry policy
		grpc.WithIdleTimeout(0), // IDLE then only ever means the connection was lost
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  50 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithChainUnaryInterceptor(
			observeInterceptor(o.plugin, o.log, o.metrics, o.onCallEnd),
			scrubInterceptor,
		),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	if err := waitReady(ctx, cc); err != nil {
		_ = cc.Close()
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	return newClient(cc, path, o), nil
}

// waitForSocket polls for path to exist and be a socket.
func waitForSocket(ctx context.Context, path string) error {
	delay := 5 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("socket does not exist: %w", ctx.Err())
		case <-t.C:
		}
		fi, err := os.Stat(path)
		switch {
		case err == nil && fi.Mode()&os.ModeSocket != 0:
			return nil
		case err == nil:
			return kinderr.Errorf(ErrInvalidEndpoint, "%q is not a socket (mode %s)", path, fi.Mode())
		case !os.IsNotExist(err):
			return fmt.Errorf("stat socket: %w", err)
		}
		t.Reset(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// waitReady connects cc and waits until it is READY.
func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			cc.Connect()
		case connectivity.Shutdown:
			return fmt.Errorf("connection shut down")
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connection not ready (state %s): %w", s, ctx.Err())
		}
	}
}
