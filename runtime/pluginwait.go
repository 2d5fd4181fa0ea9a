package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// EventPluginWait: a claim, release, create, expansion or modification
// found no healthy allocation of its plugin (it is restarting, say) and
// waits for one, up to volumes.plugin_wait or the caller's deadline;
// Message names the plugin's side and how long it waits at most. Volume
// is the request's volume, Alloc the claim's alloc, if any. Once per
// request.
const EventPluginWait = "plugin-wait"

type answerByKey struct{}

// WithAnswerBy returns ctx telling that its caller wants an answer by t,
// though ctx itself may last longer (an HTTP request whose client said
// how long it waits): a request waiting for a restarting plugin ends its
// wait at t and fails with ErrPluginUnavailable then.
func WithAnswerBy(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, answerByKey{}, t)
}

// pluginWaiter makes a volume request that finds its plugin unhealthy
// wait for it (see VolumesConfig.PluginWait).
type pluginWaiter struct {
	r   *Runtime
	op  string // "claim", "create", ... for the event
	vol string
	// alloc is the claim's alloc, if any.
	alloc string
}

// waitOut runs op, and again each time the plugin op found unhealthy has
// a healthy allocation again, until op succeeds or fails for another
// reason, or volumes.plugin_wait (from the first call) or ctx ends. The
// wait runs in the caller's goroutine: no actor waits. op fails with the
// registry's *registry.UnhealthyError (wrapped) when no allocation of its
// plugin is healthy; nothing was sent then, so running it again is safe
// (and the volume operations are idempotent besides). When the wait ends
// first, the error is ErrPluginUnavailable naming the plugin and how long
// the request waited.
func waitOut[T any](ctx context.Context, w pluginWaiter, op func() (T, error)) (T, error) {
	v, err := op()
	budget := w.r.cfg.Volumes.PluginWait
	var ue *registry.UnhealthyError
	if err == nil || budget <= 0 || !errors.As(err, &ue) {
		return v, err
	}
	began := time.Now()
	end := began.Add(budget)
	if t, ok := ctx.Value(answerByKey{}).(time.Time); ok && t.Before(end) {
		end = t
	}
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	announced := false
	for {
		if !announced {
			announced = true
			w.r.events.publish(w.event(ue, budget, wctx))
		}
		if werr := w.r.waitHealthy(wctx, ue.Plugin, ue.Role); werr != nil {
			if wctx.Err() == nil {
				return v, err // the plugin went away (deregistered): op's own error
			}
			var zero T
			return zero, kinderr.Errorf(ErrPluginUnavailable, "waited %s for plugin %q to have a healthy %s allocation again (volumes.plugin_wait %s, or the request's deadline): %w",
				time.Since(began).Round(time.Millisecond), ue.Plugin, ue.Role, budget, err)
		}
		v, err = op()
		ue = nil
		if err == nil || !errors.As(err, &ue) {
			return v, err
		}
	}
}

// event is the EventPluginWait of w.
func (w pluginWaiter) event(ue *registry.UnhealthyError, budget time.Duration, ctx context.Context) Event {
	upTo := budget.String()
	if dl, _ := ctx.Deadline(); time.Until(dl) < budget-time.Millisecond {
		upTo = time.Until(dl).Round(time.Millisecond).String() + " (the request's deadline)"
	}
	return Event{Time: time.Now(), Type: EventPluginWait, Plugin: ue.Plugin, Volume: w.vol, Alloc: w.alloc,
		Message: fmt.Sprintf("%s waits up to %s for plugin %s: it has no healthy %s allocation (restarting?)", w.op, upTo, ue.Plugin, ue.Role)}
}

// waitHealthy waits until plugin name has a healthy allocation in role,
// through the volume manager's plugins (in cluster mode a controller
// leader elsewhere will do for the controller side).
func (r *Runtime) waitHealthy(ctx context.Context, name string, role plugin.Role) error {
	typ := claim.PluginType(role)
	if r.ctrl != nil {
		return r.ctrl.WaitHealthy(ctx, name, typ)
	}
	return r.plugins.WaitHealthy(ctx, name, typ)
}
