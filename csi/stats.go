package csi

import (
	"context"
	"fmt"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// VolumeStats is the answer to NodeGetVolumeStats: how full the volume is,
// in bytes and in inodes (each nil when the plugin did not report it), and
// its condition (nil when the plugin did not report one).
type VolumeStats struct {
	Bytes     *Usage
	Inodes    *Usage
	Condition *VolumeCondition
}

// Usage is one unit (bytes or inodes) of a volume's usage. A plugin may
// leave a field out (zero); Total is what the volume can hold.
type Usage struct {
	Total     int64
	Available int64
	Used      int64
}

// VolumeCondition is a volume's health as its plugin sees it: Abnormal
// with a Message that says what is wrong, or normal (the message may still
// say something).
type VolumeCondition struct {
	Abnormal bool
	Message  string
}

// VolumeHealth is what csiactor takes from ControllerGetVolume: the
// volume's condition, nil when the controller did not report one.
type VolumeHealth struct {
	Condition *VolumeCondition
}

// Two generations of the CSI spec report a volume's condition:
//
//   - Up to v1.12, VOLUME_CONDITION (node capability 4, controller
//     capability 11): a volume_condition {abnormal, message} in field 2 of
//     NodeGetVolumeStatsResponse and of ControllerGetVolumeResponse's
//     status. The spec removed it in v1.13 (the version csiactor is built
//     with), so those fields arrive as unknown fields and are decoded here
//     by number: most plugins in use today still send them.
//   - From v1.13, GET_VOLUME_HEALTH (alpha): NodeGetVolumeHealth and
//     ControllerGetVolumeHealth answer a list of health statuses; any
//     DEGRADED, INACCESSIBLE or DATA_LOSS entry makes the volume abnormal
//     (unknown status types are ignored, as the spec asks).
//
// NodeGetVolumeStats, NodeGetVolumeHealth, ControllerGetVolume and
// ControllerGetVolumeHealth only read: the agent polls them, and a failed
// poll is not retried (the next poll is the retry). Callers that want to
// decide anyway classify their errors as PublishKind, the cautious column.

// Capability numbers of VOLUME_CONDITION, removed from the spec in v1.13.
const (
	nodeVolumeCondition       = csipb.NodeServiceCapability_RPC_Type(4)
	controllerVolumeCondition = csipb.ControllerServiceCapability_RPC_Type(11)
	// legacyConditionField is the field number of volume_condition.
	legacyConditionField = 2
)

func (c *client) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (VolumeStats, error) {
	const method = "NodeGetVolumeStats"
	resp, err := invoke(ctx, c, method, c.opts.rpcTimeout, req, c.node.NodeGetVolumeStats)
	if err != nil {
		return VolumeStats{}, err
	}
	var out VolumeStats
	for i, u := range resp.GetUsage() {
		if u.GetTotal() < 0 || u.GetAvailable() < 0 || u.GetUsed() < 0 {
			return VolumeStats{}, invalid(method, fmt.Sprintf("usage[%d] has a negative value", i))
		}
		v := &Usage{Total: u.GetTotal(), Available: u.GetAvailable(), Used: u.GetUsed()}
		switch u.GetUnit() {
		case csipb.VolumeUsage_BYTES:
			if out.Bytes == nil {
				out.Bytes = v
			}
		case csipb.VolumeUsage_INODES:
			if out.Inodes == nil {
				out.Inodes = v
			}
		}
	}
	cond, err := legacyCondition(resp.ProtoReflect())
	if err != nil {
		return VolumeStats{}, invalid(method, err.Error())
	}
	out.Condition = cond
	return out, nil
}

func (c *client) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (VolumeCondition, error) {
	resp, err := invoke(ctx, c, "NodeGetVolumeHealth", c.opts.rpcTimeout, req, c.node.NodeGetVolumeHealth)
	if err != nil {
		return VolumeCondition{}, err
	}
	return healthCondition(resp.GetVolumeHealth()), nil
}

func (c *client) ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (VolumeHealth, error) {
	const method = "ControllerGetVolume"
	resp, err := invoke(ctx, c, method, c.opts.rpcTimeout, req, c.controller.ControllerGetVolume)
	if err != nil {
		return VolumeHealth{}, err
	}
	if resp.GetVolume().GetVolumeId() == "" {
		return VolumeHealth{}, invalid(method, "volume.volume_id is empty")
	}
	var out VolumeHealth
	if st := resp.GetStatus(); st != nil {
		cond, err := legacyCondition(st.ProtoReflect())
		if err != nil {
			return VolumeHealth{}, invalid(method, err.Error())
		}
		out.Condition = cond
	}
	return out, nil
}

func (c *client) ControllerGetVolumeHealth(ctx context.Context, req *csipb.ControllerGetVolumeHealthRequest) (VolumeCondition, error) {
	resp, err := invoke(ctx, c, "ControllerGetVolumeHealth", c.opts.rpcTimeout, req, c.controller.ControllerGetVolumeHealth)
	if err != nil {
		return VolumeCondition{}, err
	}
	return healthCondition(resp.GetVolumeHealth()), nil
}

// healthCondition sums up a VolumeHealth: abnormal when it lists a known
// adverse status, with every listed status in the message as
// "STATUS Reason: message", joined by "; ".
func healthCondition(h *csipb.VolumeHealth) VolumeCondition {
	var out VolumeCondition
	var parts []string
	for _, e := range h.GetHealthStatuses() {
		switch e.GetStatus() {
		case csipb.VolumeHealthErrorType_DEGRADED, csipb.VolumeHealthErrorType_INACCESSIBLE, csipb.VolumeHealthErrorType_DATA_LOSS:
		default:
			continue // unknown types are ignored, as the spec asks
		}
		out.Abnormal = true
		p := e.GetStatus().String()
		if r := e.GetReason(); r != "" {
			p += " " + r
		}
		if m := e.GetMessage(); m != "" {
			p += ": " + m
		}
		parts = append(parts, p)
	}
	out.Message = strings.Join(parts, "; ")
	return out
}

// legacyCondition decodes the volume_condition (field 2: {bool abnormal =
// 1; string message = 2}) that a plugin built with the spec before v1.13
// sends, from m's unknown fields. It returns nil when there is none.
func legacyCondition(m protoreflect.Message) (*VolumeCondition, error) {
	var out *VolumeCondition
	b := m.GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("malformed unknown field: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == legacyConditionField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("malformed volume_condition: %w", protowire.ParseError(n))
			}
			cond, err := decodeCondition(v)
			if err != nil {
				return nil, err
			}
			out = cond // the last one wins, as protobuf merges
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, fmt.Errorf("malformed unknown field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return out, nil
}

func decodeCondition(b []byte) (*VolumeCondition, error) {
	out := &VolumeCondition{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("malformed volume_condition: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("malformed volume_condition.abnormal: %w", protowire.ParseError(n))
			}
			out.Abnormal = v != 0
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("malformed volume_condition.message: %w", protowire.ParseError(n))
			}
			out.Message = string(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("malformed volume_condition field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return out, nil
}
