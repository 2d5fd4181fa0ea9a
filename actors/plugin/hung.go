package plugin

import (
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
)

// observeCall is the client's call observer (csi.WithCallObserver): it
// passes the end of each node RPC that counts towards HungRPCRestart to
// the actor. It runs on the caller's goroutine and never blocks.
func (a *Actor) observeCall(e csi.CallEnd) {
	if e.Service != csi.ServiceNode || e.Method == "NodeGetInfo" || e.Method == "NodeGetCapabilities" {
		return // identity and fingerprint RPCs: the heartbeat watches those
	}
	timedOut := csi.Code(e.Err) == codes.DeadlineExceeded
	if !timedOut && csi.Unanswered(e.Err) {
		return // canceled by the caller, or the connection is down: no answer either way
	}
	if a.ctx.Err() != nil {
		return
	}
	a.send(&nodeCallEnded{owner: a, timedOut: timedOut})
}

// onNodeCallEnded counts node RPCs that end in DeadlineExceeded in a row;
// an answer starts the count over. At HungRPCRestart a fingerprint checks
// that the plugin still answers (see hungFingerprint): a plugin that does
// not is unhealthy, and HealthTimeout deals with it. The check waits for
// the first fingerprint that answers: if the node RPCs have not answered
// meanwhile, the plugin is hung.
func (a *Actor) onNodeCallEnded(m *nodeCallEnded) {
	if a.done || a.cfg.HungRPCRestart <= 0 {
		return
	}
	if !m.timedOut {
		a.nodeTimeouts = 0
		return
	}
	a.nodeTimeouts++
	if a.nodeTimeouts < a.cfg.HungRPCRestart || a.hungCheck || a.killedFor != "" || a.procDown() {
		return
	}
	a.log.WithField("timeouts", a.nodeTimeouts).Debug("node RPCs time out in a row: checking that the plugin still answers")
	a.hungCheck = true
	a.fingerprintNow()
}

// hungFingerprint settles a hung check with a successful fingerprint: if
// the node RPCs still time out in a row, the plugin answers its
// fingerprint but hangs its node RPCs. An exec-managed allocation's
// process is killed (its exit restarts it with the backoff); an attached
// one is reported unhealthy until its next fingerprint. It reports
// whether the plugin was found hung.
func (a *Actor) hungFingerprint() bool {
	if !a.hungCheck {
		return false
	}
	a.hungCheck = false
	n := a.nodeTimeouts
	if n < a.cfg.HungRPCRestart || a.killedFor != "" {
		return false
	}
	a.nodeTimeouts = 0
	a.status.Hung++
	why := fmt.Sprintf("node RPCs hang: %d in a row ended in DeadlineExceeded while the plugin answers Probe", n)
	log := a.log.WithField("timeouts", n)
	if a.spec.ContainerManaged() {
		log.WithField("container", shortID(a.ctr.ID())).Warn("plugin answers Probe but its node RPCs hang: killing its container to restart it")
		a.killedFor = why
		a.setHealth(false, why+"; restarting the plugin")
		a.killContainer()
		return true
	}
	if a.spec.ExecManaged() {
		log.WithField("pid", a.proc.PID()).Warn("plugin answers Probe but its node RPCs hang: killing its process to restart it")
		a.killedFor = why
		a.setHealth(false, why+"; restarting the plugin")
		a.proc.Kill()
		return true
	}
	log.Warn("attached plugin answers Probe but its node RPCs hang; it runs outside the agent, which only reports it")
	a.setHealth(false, why)
	return true
}
