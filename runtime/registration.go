package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/registration"
)

// SourceRegistration is the Source of an allocation registered from
// plugins.registration_dir.
const SourceRegistration = string(registry.SourceRegistration)

// startRegistration starts watching plugins.registration_dir, or, when it
// is not set, deregisters the drivers an earlier run registered from one:
// nothing would deregister them when their registrars go.
func (r *Runtime) startRegistration(ctx context.Context) error {
	dir := r.cfg.Plugins.RegistrationDir
	if dir == "" {
		names, err := dirRegistrar{r}.Registered(ctx)
		if err != nil {
			return fmt.Errorf("list allocations: %w", err)
		}
		for _, name := range names {
			if err := r.registry.Deregister(ctx, name); err != nil && !errors.Is(err, registry.ErrAllocationNotFound) {
				return fmt.Errorf("deregister %s: %w", name, mapErr(err))
			}
			r.log.WithField("alloc", name).Info("allocation deregistered: it came from a registration directory, and plugins.registration_dir is no longer set")
		}
		r.plugins.invalidate()
		return nil
	}
	w, err := registration.Start(registration.Config{
		Dir:         dir,
		Registrar:   dirRegistrar{r},
		Log:         r.log.WithField("component", "registration"),
		CallTimeout: r.cfg.Plugins.ProbeTimeout,
		// Registry calls wait at most its request timeout, and a
		// deregistration for the plugin to stop.
		RegisterTimeout: r.cfg.Plugins.KillTimeout + time.Minute,
		OnRefused: func(name, socket, reason string) {
			r.events.publish(Event{Time: time.Now(), Type: EventRegistrationRefused, Plugin: name,
				Message: fmt.Sprintf("driver on registration socket %s refused: %s", socket, reason)})
		},
	})
	if err != nil {
		return fmt.Errorf("plugins.registration_dir: %w", err)
	}
	r.registration = w
	return nil
}

// dirRegistrar registers the drivers of the registration directory in the
// registry: each is an attached node allocation whose ID and plugin name
// are the driver's name, with source "registration".
type dirRegistrar struct{ r *Runtime }

var _ registration.Registrar = dirRegistrar{}

// Register registers d, or replaces the allocation an earlier
// registration of d made with another endpoint. Bad names and endpoints,
// and IDs or sockets other allocations have, are refused.
func (d dirRegistrar) Register(ctx context.Context, drv registration.Driver) error {
	if err := ValidateID("driver name", drv.Name); err != nil {
		return fmt.Errorf("%w: %s", registration.ErrRefused, err.Error())
	}
	if err := ValidateSocketPath("endpoint", drv.Endpoint); err != nil {
		return fmt.Errorf("%w: CSI driver %q: %s", registration.ErrRefused, drv.Name, err.Error())
	}
	if filepath.Dir(filepath.Clean(strings.TrimPrefix(drv.Endpoint, "unix://"))) == filepath.Join(d.r.cfg.DataDir, ProxyDir) {
		// Forwarding to itself: the kubelet's registrar of the proxy
		// belongs in the kubelet's directory, not the agent's.
		return fmt.Errorf("%w: CSI driver %q: endpoint %s is the agent's own CSI proxy", registration.ErrRefused, drv.Name, drv.Endpoint)
	}
	spec := plugin.Spec{ID: drv.Name, Plugin: drv.Name, Type: plugin.Node, Socket: drv.Endpoint}
	reg := d.r.registry
	defer d.r.plugins.invalidate()
	_, err := reg.RegisterFrom(ctx, spec, registry.SourceRegistration)
	if errors.Is(err, registry.ErrConflict) {
		// Registered from the directory before, with another endpoint:
		// the registrar was redeployed. The new endpoint replaces it.
		if a, gerr := reg.Allocation(ctx, drv.Name); gerr == nil && a.Source == registry.SourceRegistration && a.Socket != spec.Socket {
			d.r.log.WithFields(logrus.Fields{"alloc": drv.Name, "socket": spec.Socket}).
				Info("driver registered again with another endpoint: replacing its allocation")
			if err := reg.Deregister(ctx, drv.Name); err != nil && !errors.Is(err, registry.ErrAllocationNotFound) {
				return err
			}
			_, err = reg.RegisterFrom(ctx, spec, registry.SourceRegistration)
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, registry.ErrConflict), errors.Is(err, plugin.ErrInvalidSpec):
		msg := strings.TrimPrefix(err.Error(), registry.ErrConflict.Error()+": ")
		return fmt.Errorf("%w: %s", registration.ErrRefused, msg)
	}
	return err // busy, store, stopped: tried again
}

// Deregister deregisters the allocation of driver name, if it came from
// the registration directory.
func (d dirRegistrar) Deregister(ctx context.Context, name string) error {
	reg := d.r.registry
	a, err := reg.Allocation(ctx, name)
	if errors.Is(err, registry.ErrAllocationNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if a.Source != registry.SourceRegistration {
		return nil // registered by other means since: not the directory's
	}
	err = reg.Deregister(ctx, name)
	d.r.plugins.invalidate()
	if errors.Is(err, registry.ErrAllocationNotFound) {
		return nil
	}
	return err
}

// Registered lists the allocations that came from the registration
// directory.
func (d dirRegistrar) Registered(ctx context.Context) ([]string, error) {
	all, err := d.r.registry.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, a := range all {
		if a.Source == registry.SourceRegistration {
			names = append(names, a.ID)
		}
	}
	return names, nil
}
