package runtime

import (
	"context"
	"time"

	"github.com/csiactor/csiactor/actors/volume"
)

// DefaultStatsInterval is the default of volumes.stats_interval: how often
// the usage and condition of every volume with a published claim are
// polled.
const DefaultStatsInterval = time.Minute

// DefaultStallAfter is the default of volumes.stall_after: how long a
// claim or past claim may stay in one state before it is stalled.
const DefaultStallAfter = volume.DefaultStallAfter

// Event types of a volume's condition, as its plugin reports it.
const (
	// EventVolumeConditionAbnormal: the plugin reports the volume as
	// abnormal (first seen, or with a new message); the message is the
	// plugin's.
	EventVolumeConditionAbnormal = volume.EventVolumeAbnormal
	// EventVolumeConditionNormal: a volume reported abnormal is normal
	// again.
	EventVolumeConditionNormal = volume.EventVolumeNormal
)

// Usage and condition statuses of a volume with a published claim on this
// host (Volume.UsageStatus and Volume.ConditionStatus).
const (
	// StatsReported: the plugin's last report is shown.
	StatsReported = volume.StatsReported
	// StatsPending: the plugin reports it, and no poll has recorded it
	// yet (or the node plugin does not answer now to say).
	StatsPending = volume.StatsPending
	// StatsUnsupported: the plugin does not report it.
	StatsUnsupported = volume.StatsUnsupported
)

// VolumeUsage is how full a volume is, as its node plugin last reported it
// (NodeGetVolumeStats, polled every volumes.stats_interval while the
// volume has a published claim). Fields the plugin did not report are
// zero (and left out of the JSON).
type VolumeUsage = volume.Usage

// VolumeCondition is a volume's health as its plugin last reported it
// (VOLUME_CONDITION or GET_VOLUME_HEALTH, on the node or the controller):
// Abnormal with the plugin's Message, or normal.
type VolumeCondition = volume.Condition

// PollVolumeStats polls the usage and condition of every volume with a
// published claim now, as the runtime does every volumes.stats_interval,
// and returns when they are recorded.
func (r *Runtime) PollVolumeStats(ctx context.Context) error {
	if err := r.ready(); err != nil {
		return err
	}
	return mapErr(r.volumes.PollStats(ctx))
}
