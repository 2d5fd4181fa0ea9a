package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin/container"
)

// containerStartTimeout bounds a container's start, a pull included.
const containerStartTimeout = 10 * time.Minute

// ctrExited is sent to the allocation actor when its container stopped.
type ctrExited struct {
	owner *Actor
	c     *container.Container
}

// startContainer starts the plugin container of a container-managed
// allocation or, the first time the engine answers, adopts the one a
// previous agent left running (found by its labels). A failure (the
// engine down, the image missing) is retried with the restart backoff,
// and the health says why, naming the engine and its socket.
func (a *Actor) startContainer() {
	im := *a.spec.Image
	if !a.adoptTried {
		adopted, err := a.adoptContainer(im.EngineName())
		if err != nil {
			a.startFailed(err, err.Error())
			return
		}
		a.adoptTried = true
		if adopted {
			return
		}
	}
	if err := a.prepareSocketDir(); err != nil {
		a.startFailed(err, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, containerStartTimeout)
	c, err := a.cfg.Containers.Start(ctx, a.runSpec(), a.log)
	cancel()
	if err != nil {
		a.startFailed(err, err.Error())
		return
	}
	a.failures = 0
	a.startFailures = 0
	a.setHealth(false, fmt.Sprintf("starting: %s container %s started", c.Engine(), shortID(c.ID())))
	a.log.WithField("container", shortID(c.ID())).WithField("engine", c.Engine()).Info("plugin container started")
	a.watchContainer(c)
	if a.client != nil {
		a.heart.Reset(a.cfg.UnhealthyRetry)
	}
}

// runSpec is how the allocation's container runs.
func (a *Actor) runSpec() container.RunSpec {
	return container.RunSpec{
		Alloc: a.spec.ID, Type: string(a.spec.Type), Image: *a.spec.Image,
		Args: a.spec.containerArgs(), Env: a.spec.containerEnv(),
		SocketDir: a.procDir(), OutputDir: a.procDir(),
	}
}

// adoptContainer takes over the running container of the allocation that
// a previous agent left, when it runs what the spec says; the start that
// follows otherwise removes it and any other (so that two never run, and
// a spec changed in the config file while no agent ran takes effect).
func (a *Actor) adoptContainer(engine string) (bool, error) {
	ctx, cancel := context.WithTimeout(a.ctx, 30*time.Second)
	defer cancel()
	found, err := a.cfg.Containers.Find(ctx, engine, a.spec.ID)
	if err != nil {
		return false, err
	}
	want := a.cfg.Containers.SpecDigest(a.runSpec())
	for _, f := range found {
		if !f.Running {
			continue
		}
		if f.Spec != want {
			a.log.WithField("container", shortID(f.ID)).Info("not adopting the plugin container of the previous agent: it was created for another spec of the allocation")
			continue
		}
		c, err := a.cfg.Containers.Adopt(ctx, engine, f.ID, a.procDir(), a.log)
		if err != nil {
			a.log.WithError(err).WithField("container", shortID(f.ID)).Info("not adopting the plugin container of the previous agent")
			continue
		}
		a.adopting = true
		a.setHealth(false, fmt.Sprintf("starting: adopted %s container %s left running by the previous agent", engine, shortID(c.ID())))
		a.log.WithField("container", shortID(c.ID())).Info("adopted the plugin container left running by the previous agent")
		a.watchContainer(c)
		return true, nil
	}
	return false, nil
}

// watchContainer makes c the allocation's container and sends ctrExited
// when it stops.
func (a *Actor) watchContainer(c *container.Container) {
	a.ctr = c
	a.status.ContainerID, a.status.ImageDigest = c.ID(), c.ImageID()
	a.watchExit(c.Exited(), func() { a.send(&ctrExited{owner: a, c: c}) })
}

func (a *Actor) onCtrExited(ctx actor.Context, m *ctrExited) {
	if a.done || m.c != a.ctr {
		return
	}
	m.c.Detach()
	a.ctr = nil
	a.adopting = false
	a.status.ContainerID, a.status.ImageDigest = "", ""
	a.status.Exits++
	if time.Since(m.c.Started()) >= a.cfg.RestartBackoff.Window {
		a.restartStep = 0
	}
	status := "container " + m.c.Status()
	if a.killedFor != "" {
		status = "container killed after " + a.killedFor
	}
	a.log.WithField("status", status).Warn("plugin container exited")
	a.processExited(status)
	a.hung.Stop()
	a.report(ctx)
}

// killContainer kills the container to restart it (health timeout, hung
// RPCs); its exit restarts it with the backoff.
func (a *Actor) killContainer() {
	ctx, cancel := context.WithTimeout(a.ctx, 30*time.Second)
	defer cancel()
	if err := a.ctr.Kill(ctx); err != nil {
		a.log.WithError(err).Error("cannot kill the plugin container")
	}
}

// stopContainer ends the allocation's container at teardown: left
// running for the next agent when keep, else stopped and removed (and on
// deregistration any other container of the allocation too).
func (a *Actor) stopContainer(keep, deregistered bool) {
	c := a.ctr
	switch {
	case c != nil && keep:
		c.Detach()
		a.log.WithField("container", shortID(c.ID())).Info("plugin container left running for the next agent")
	case c != nil:
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopGrace+30*time.Second)
		if err := c.Stop(ctx, a.cfg.StopGrace); err != nil {
			a.log.WithError(err).Error("plugin container did not stop")
		} else {
			a.log.WithField("container", shortID(c.ID())).Info("plugin container stopped and removed")
		}
		cancel()
	}
	a.ctr = nil
	a.status.ContainerID, a.status.ImageDigest = "", ""
	if deregistered && a.spec.ContainerManaged() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := a.cfg.Containers.RemoveAll(ctx, a.spec.Image.EngineName(), a.spec.ID, a.log); err != nil {
			a.log.WithError(err).Error("cannot remove the allocation's containers")
		}
		cancel()
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// containerArgs returns the image's args with {endpoint} and {socket}
// substituted.
func (s Spec) containerArgs() []string {
	r := strings.NewReplacer("{endpoint}", s.Endpoint(), "{socket}", s.Socket)
	out := make([]string, len(s.Image.Args))
	for i, a := range s.Image.Args {
		out[i] = r.Replace(a)
	}
	return out
}

// containerEnv returns the container's environment: the image's env,
// sorted by name, then CSI_ENDPOINT.
func (s Spec) containerEnv() []string {
	var env []string
	for _, k := range slices.Sorted(maps.Keys(s.Image.Env)) {
		env = append(env, k+"="+s.Image.Env[k])
	}
	return append(env, "CSI_ENDPOINT="+s.Endpoint())
}

// healthyDescription describes a healthy allocation: "healthy", and for a
// container-managed one whose engine does not answer, that too (naming the
// engine and its socket): the plugin answers, but its container's exit is
// not seen until the engine answers again.
func (a *Actor) healthyDescription() string {
	if a.ctr != nil {
		if down := a.ctr.EngineDown(); down != "" {
			return "healthy, but its container is not watched: " + down
		}
	}
	return "healthy"
}
