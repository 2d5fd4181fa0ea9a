package csi

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// shortMethod turns "/csi.v1.Node/NodePublishVolume" into
// "NodePublishVolume", the method label of logs and metrics.
func shortMethod(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// CallEnd is what a call observer (WithCallObserver) learns of an RPC
// that ended.
type CallEnd struct {
	// Method is the short method name, like "NodePublishVolume".
	Method string
	// Service is the service the method belongs to.
	Service Service
	// Err is the call's error as the caller gets it (scrubbed of secrets),
	// nil on success. A call its deadline ended has Code DeadlineExceeded.
	Err error
}

// serviceOf returns the service of a gRPC method name
// ("/csi.v1.Node/NodePublishVolume" → ServiceNode) without a lookup.
func serviceOf(fullMethod string) Service {
	svc, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if i := strings.LastIndexByte(svc, '.'); i >= 0 {
		svc = svc[i+1:]
	}
	return Service(svc)
}

// observeInterceptor records every call's duration in m (when not nil),
// when log is at debug level logs the method, duration, code, and the
// request and response with secrets and mount flags stripped, and passes
// the call's end to onEnd (when not nil). It runs outside
// scrubInterceptor, so the errors it sees and logs are scrubbed.
func observeInterceptor(plugin string, log *logrus.Entry, m *Metrics, onEnd func(CallEnd)) grpc.UnaryClientInterceptor {
	// The series of successful calls, by full method: looked up once per
	// method instead of hashing three label values on every call.
	var okSeries sync.Map // string -> prometheus.Observer
	observe := func(fullMethod, method string, code codes.Code, seconds float64) {
		if code != codes.OK {
			m.operations.WithLabelValues(plugin, method, code.String()).Observe(seconds)
			return
		}
		o, ok := okSeries.Load(fullMethod)
		if !ok {
			o, _ = okSeries.LoadOrStore(fullMethod, m.operations.WithLabelValues(plugin, method, codes.OK.String()))
		}
		o.(prometheus.Observer).Observe(seconds)
	}
	return func(ctx context.Context, fullMethod string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
	) error {
		start := time.Now()
		err := timedOut(ctx, invoker(ctx, fullMethod, req, reply, cc, opts...))
		elapsed := time.Since(start)
		code := Code(err)
		method := shortMethod(fullMethod)
		if m != nil {
			observe(fullMethod, method, code, elapsed.Seconds())
		}
		if log.Logger.IsLevelEnabled(logrus.DebugLevel) {
			fields := logrus.Fields{
				"method":    method,
				"duration":  elapsed,
				"grpc_code": code.String(),
				"request":   sanitizeAny(req),
			}
			if err != nil {
				// Only the plugin's status message, already scrubbed of
				// the request's secrets by scrubInterceptor.
				fields["error"] = status.Convert(err).Message()
			} else {
				fields["response"] = sanitizeAny(reply)
			}
			log.WithFields(fields).Debug("CSI call")
		}
		if onEnd != nil {
			onEnd(CallEnd{Method: method, Service: serviceOf(fullMethod), Err: err})
		}
		return err
	}
}

// timedOut turns the Canceled error of a call that the deadline watchdog
// ended (see deadlines) into the DeadlineExceeded a timer-based context
// would have given, so that logs, metrics and Classify see a timeout.
func timedOut(ctx context.Context, err error) error {
	if err != nil && status.Code(err) == codes.Canceled && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	return err
}

func sanitizeAny(v any) string {
	if m, ok := v.(proto.Message); ok {
		return Sanitize(m)
	}
	return "<not a protobuf message>"
}

// scrubInterceptor removes the request's secrets and mount flags from the
// error a plugin returns: a plugin that echoes its input ("mount failed:
// mount -o password=hunter2 ...") must not put a secret into our logs or
// into the errors we return. The status code is kept; status details that
// contain a secret are dropped.
func scrubInterceptor(ctx context.Context, fullMethod string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
) error {
	err := invoker(ctx, fullMethod, req, reply, cc, opts...)
	if err == nil {
		return nil
	}
	m, ok := req.(proto.Message)
	if !ok {
		return err
	}
	return scrubError(err, secretValues(m))
}

// scrubError returns err with every secret removed from its gRPC status.
func scrubError(err error, secrets []string) error {
	if len(secrets) == 0 {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		if s := err.Error(); scrubString(s, secrets) != s {
			// Not a status error, but it carries a secret: keep the
			// code (Unknown) and a scrubbed text only.
			return status.Error(Code(err), scrubString(s, secrets))
		}
		return err
	}
	p := st.Proto()
	changed := false
	if msg := scrubString(p.GetMessage(), secrets); msg != p.GetMessage() {
		p.Message = msg
		changed = true
	}
	kept := p.Details[:0]
	for _, d := range p.GetDetails() {
		if containsAny(d.GetValue(), secrets) {
			changed = true
			continue
		}
		kept = append(kept, d)
	}
	p.Details = kept
	if !changed {
		return err
	}
	return status.FromProto(p).Err()
}
