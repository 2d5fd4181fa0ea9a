package claim

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/csi"
)

// NewStepFailures makes csiactor_claim_step_failures_total {plugin, step,
// code}: one per failed claim step (publish, release, repair and forced
// teardown steps alike), by plugin, CSI method (step, like
// "NodeUnstageVolume") and gRPC status code name (code, like
// "FailedPrecondition"). A step sent to no plugin because none was
// healthy is "Unavailable"; an error without a gRPC status is
// "DeadlineExceeded", "Canceled" or "Unknown" (see csi.Code). Give it to
// RunnerConfig.StepFailures; the caller registers it.
func NewStepFailures() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "csiactor_claim_step_failures_total",
		Help: "Failed claim and release steps, by plugin, step (the CSI method) and code (the gRPC status code; Unavailable when no plugin could be asked).",
	}, []string{"plugin", "step", "code"})
}

// failureCode is the code label of csiactor_claim_step_failures_total for
// the failed result res.
func failureCode(res Result) string {
	if res.Unavailable {
		return "Unavailable"
	}
	return csi.Code(res.Err).String()
}

// countFailure counts the failed step s, whose result is res.
func (r *Runner) countFailure(s Step, res Result) {
	if r.failures != nil {
		r.failures.WithLabelValues(s.Plugin, s.Method.String(), failureCode(res)).Inc()
	}
}
