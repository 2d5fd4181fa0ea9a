package claim

import (
	"path/filepath"
	"strings"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// The states of a current claim, in order. A claim's state is the last step
// it completed; steps that do not apply (no controller, no staging) are
// skipped.
const (
	// StateReserved: the claim is recorded and counts against the limits;
	// nothing has been sent to the plugin yet (or the outcome of the first
	// RPC is not recorded).
	StateReserved = "reserved"
	// StateControllerPublished: ControllerPublishVolume succeeded for this
	// host and its publish context is kept on the volume.
	StateControllerPublished = "controller-published"
	// StateStaged: the volume is staged for this claim's usage.
	StateStaged = "staged"
	// StatePublished: NodePublishVolume succeeded; the volume is at the
	// claim's target path.
	StatePublished = "published"
	// StateLost: the host was found missing what the claim published
	// (persistence.Claim.Repair says what). The plugin may still count
	// the target as published, so NodeUnpublishVolume resets its record
	// first; the claim then goes through its publish steps again from
	// reserved.
	StateLost = "lost"
)

// The states of a past claim (a released claim, or one whose publish failed),
// in order.
const (
	// StateTaken: released; still published (or possibly published) on
	// this host.
	StateTaken = "taken"
	// StateNodeDetached: unpublished, and unstaged if it was the last user of
	// its staging.
	StateNodeDetached = "node-detached"
	// StateControllerDetached: ControllerUnpublishVolume done, or not needed
	// (no controller, or another claim on this host still needs it).
	StateControllerDetached = "controller-detached"
	// StateReadyToFree: nothing is left on the plugin side.
	StateReadyToFree = "ready-to-free"
	// StateFreed: the past claim is gone from the record. A record never
	// holds this state; it is reported to callers only.
	StateFreed = "freed"
)

// Mode is what a claim does with the volume: read or write.
type Mode string

// The claim modes.
const (
	ModeRead  Mode = "read"
	ModeWrite Mode = "write"
)

// ParseMode parses "read" or "write".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeRead, ModeWrite:
		return Mode(s), nil
	}
	return "", kinderr.Errorf(ErrInvalid, "mode %q: want read or write", s)
}

// Usage names one way of using a volume on the host: read-only or
// read-write, the attachment mode and the access mode, like
// "rw-file-system-single-node-writer". Each usage has its own staging path.
func Usage(mode Mode, c csi.VolumeCapability) string {
	rw := "rw"
	if mode == ModeRead {
		rw = "ro"
	}
	return rw + "-" + c.AttachmentMode.String() + "-" + c.AccessMode.String()
}

// StagingPath returns <dataDir>/volumes/<plugin>/staging/<volume>/<usage>.
func StagingPath(dataDir, plugin, volume, usage string) string {
	return filepath.Join(dataDir, "volumes", plugin, "staging", volume, usage)
}

// TargetPath returns
// <dataDir>/volumes/<plugin>/per-alloc/<alloc>/<volume>/<usage>.
func TargetPath(dataDir, plugin, alloc, volume, usage string) string {
	return filepath.Join(dataDir, "volumes", plugin, "per-alloc", alloc, volume, usage)
}

// MaxNameLen is the longest volume, allocation or plugin name accepted; they
// become path components on the host.
const MaxNameLen = 128

// CheckName reports whether s can be used as one path component on the host
// (a volume ID, an allocation ID or a plugin name): not empty, at most
// MaxNameLen bytes, not "." or "..", no "/" , no NUL and no control
// character. field names s in the error.
func CheckName(field, s string) error {
	switch {
	case s == "":
		return kinderr.Errorf(ErrInvalid, "%s is empty", field)
	case len(s) > MaxNameLen:
		return kinderr.Errorf(ErrInvalid, "%s is %d bytes long (at most %d)", field, len(s), MaxNameLen)
	case s == "." || s == "..":
		return kinderr.Errorf(ErrInvalid, "%s %q is not a usable name", field, s)
	case strings.ContainsAny(s, "/\\"):
		return kinderr.Errorf(ErrInvalid, "%s %q contains a path separator", field, s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return kinderr.Errorf(ErrInvalid, "%s %q contains a control character", field, s)
		}
	}
	return nil
}
