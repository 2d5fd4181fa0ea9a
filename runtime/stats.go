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

// VolumeUsage is how full a volume is, as its node plugin last reported it
// (NodeGetVolumeStats, polled every volumes.stats_interval while the
// volume has a published claim). Fields the plugin did not report are
// zero (and left out of the JSON).
type VolumeUsage struct {
	CapacityBytes  int64     `json:"capacity_bytes,omitempty"`
	AvailableBytes int64     `json:"available_bytes,omitempty"`
	UsedBytes      int64     `json:"used_bytes,omitempty"`
	Inodes         int64     `json:"inodes,omitempty"`
	InodesFree     int64     `json:"inodes_free,omitempty"`
	InodesUsed     int64     `json:"inodes_used,omitempty"`
	CheckedAt      time.Time `json:"checked_at"`
}

// VolumeCondition is a volume's health as its plugin last reported it
// (VOLUME_CONDITION or GET_VOLUME_HEALTH, on the node or the controller):
// Abnormal with the plugin's Message, or normal.
type VolumeCondition struct {
	Abnormal  bool      `json:"abnormal"`
	Message   string    `json:"message,omitempty"`
	CheckedAt time.Time `json:"checked_at"`
}

func usageFromManager(u *volume.Usage) *VolumeUsage {
	if u == nil {
		return nil
	}
	out := VolumeUsage(*u)
	return &out
}

func conditionFromManager(c *volume.Condition) *VolumeCondition {
	if c == nil {
		return nil
	}
	out := VolumeCondition(*c)
	return &out
}

// PollVolumeStats polls the usage and condition of every volume with a
// published claim now, as the runtime does every volumes.stats_interval,
// and returns when they are recorded.
func (r *Runtime) PollVolumeStats(ctx context.Context) error {
	if err := r.ready(); err != nil {
		return err
	}
	return mapErr(r.volumes.PollStats(ctx))
}
