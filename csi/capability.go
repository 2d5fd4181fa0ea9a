package csi

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/internal/kinderr"
)

// AccessMode is how a volume may be used across nodes and writers. Its zero
// value is AccessModeUnknown, which is never valid in a request.
type AccessMode int

// The access modes of the CSI spec, by their kebab-case names.
const (
	AccessModeUnknown AccessMode = iota
	AccessModeSingleNodeReaderOnly
	AccessModeSingleNodeWriter
	AccessModeSingleNodeSingleWriter
	AccessModeSingleNodeMultiWriter
	AccessModeMultiNodeReaderOnly
	AccessModeMultiNodeSingleWriter
	AccessModeMultiNodeMultiWriter
)

var accessModeNames = [...]string{
	AccessModeUnknown:                "unknown",
	AccessModeSingleNodeReaderOnly:   "single-node-reader-only",
	AccessModeSingleNodeWriter:       "single-node-writer",
	AccessModeSingleNodeSingleWriter: "single-node-single-writer",
	AccessModeSingleNodeMultiWriter:  "single-node-multi-writer",
	AccessModeMultiNodeReaderOnly:    "multi-node-reader-only",
	AccessModeMultiNodeSingleWriter:  "multi-node-single-writer",
	AccessModeMultiNodeMultiWriter:   "multi-node-multi-writer",
}

var accessModeToCSI = [...]csipb.VolumeCapability_AccessMode_Mode{
	AccessModeUnknown:                csipb.VolumeCapability_AccessMode_UNKNOWN,
	AccessModeSingleNodeReaderOnly:   csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	AccessModeSingleNodeWriter:       csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	AccessModeSingleNodeSingleWriter: csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	AccessModeSingleNodeMultiWriter:  csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
	AccessModeMultiNodeReaderOnly:    csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	AccessModeMultiNodeSingleWriter:  csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
	AccessModeMultiNodeMultiWriter:   csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
}

// ParseAccessMode parses a kebab-case access mode name such as
// "single-node-writer". The error names the bad value and the valid ones.
func ParseAccessMode(s string) (AccessMode, error) {
	for m := AccessModeSingleNodeReaderOnly; int(m) < len(accessModeNames); m++ {
		if accessModeNames[m] == s {
			return m, nil
		}
	}
	return AccessModeUnknown, kinderr.Errorf(ErrInvalidCapability,
		"unknown access mode %q (want one of %s)", s, strings.Join(accessModeNames[1:], ", "))
}

// String returns the kebab-case name of m.
func (m AccessMode) String() string {
	if m < 0 || int(m) >= len(accessModeNames) {
		return fmt.Sprintf("access-mode(%d)", int(m))
	}
	return accessModeNames[m]
}

// GoString returns the Go name of m, for %#v.
func (m AccessMode) GoString() string { return "csi.AccessMode(" + m.String() + ")" }

// Valid reports whether m is a known mode other than AccessModeUnknown.
func (m AccessMode) Valid() bool { return m > AccessModeUnknown && int(m) < len(accessModeNames) }

// ReadOnly reports whether m allows no writer at all.
func (m AccessMode) ReadOnly() bool {
	return m == AccessModeSingleNodeReaderOnly || m == AccessModeMultiNodeReaderOnly
}

// ToCSI returns the protobuf enum value of m.
func (m AccessMode) ToCSI() csipb.VolumeCapability_AccessMode_Mode {
	if !m.Valid() {
		return csipb.VolumeCapability_AccessMode_UNKNOWN
	}
	return accessModeToCSI[m]
}

// AccessModeFromCSI converts a protobuf access mode. UNKNOWN and values this
// version does not know are an error.
func AccessModeFromCSI(pm csipb.VolumeCapability_AccessMode_Mode) (AccessMode, error) {
	for m := AccessModeSingleNodeReaderOnly; int(m) < len(accessModeToCSI); m++ {
		if accessModeToCSI[m] == pm {
			return m, nil
		}
	}
	return AccessModeUnknown, kinderr.Errorf(ErrInvalidCapability, "unknown CSI access mode %d", int32(pm))
}

// AttachmentMode is how a volume is presented to its user: a raw block device
// or a mounted file system.
type AttachmentMode int

// The attachment modes, by their kebab-case names.
const (
	AttachmentModeUnknown AttachmentMode = iota
	AttachmentModeBlockDevice
	AttachmentModeFileSystem
)

var attachmentModeNames = [...]string{
	AttachmentModeUnknown:     "unknown",
	AttachmentModeBlockDevice: "block-device",
	AttachmentModeFileSystem:  "file-system",
}

// ParseAttachmentMode parses "block-device" or "file-system".
func ParseAttachmentMode(s string) (AttachmentMode, error) {
	switch s {
	case "block-device":
		return AttachmentModeBlockDevice, nil
	case "file-system":
		return AttachmentModeFileSystem, nil
	}
	return AttachmentModeUnknown, kinderr.Errorf(ErrInvalidCapability,
		"unknown attachment mode %q (want block-device or file-system)", s)
}

// String returns the kebab-case name of m.
func (m AttachmentMode) String() string {
	if m < 0 || int(m) >= len(attachmentModeNames) {
		return fmt.Sprintf("attachment-mode(%d)", int(m))
	}
	return attachmentModeNames[m]
}

// GoString returns the Go name of m, for %#v.
func (m AttachmentMode) GoString() string { return "csi.AttachmentMode(" + m.String() + ")" }

// Valid reports whether m is block-device or file-system.
func (m AttachmentMode) Valid() bool {
	return m == AttachmentModeBlockDevice || m == AttachmentModeFileSystem
}

// MountOptions are the file-system options of a mount. MountFlags may hold
// secrets (credentials passed as mount options are common), so String and
// GoString never print them; only their count.
type MountOptions struct {
	FSType     string
	MountFlags []string
	// VolumeMountGroup is the group (a decimal gid) the node plugin
	// makes the volume writable by (CSI volume_mount_group, for plugins
	// with VOLUME_MOUNT_GROUP); empty for none.
	VolumeMountGroup string
}

// String prints the file-system type and the number of mount flags, never
// the flags themselves.
func (o *MountOptions) String() string {
	if o == nil {
		return "<nil>"
	}
	return fmt.Sprintf("fs_type=%q mount_flags=[%d redacted]", o.FSType, len(o.MountFlags))
}

// GoString is String for %#v, so that debug printing redacts too.
func (o *MountOptions) GoString() string {
	if o == nil {
		return "(*csi.MountOptions)(nil)"
	}
	return "&csi.MountOptions{" + o.String() + "}"
}

// Format makes every fmt verb print the redacted form: %#v prints
// GoString, every other verb String. Without it %d or %x on a MountOptions
// value would print the flags field by field.
func (o MountOptions) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, o.String(), o.GoString())
}

// formatRedacted writes s (or goS for %#v) for any verb; %q quotes s.
func formatRedacted(f fmt.State, verb rune, s, goS string) {
	switch {
	case verb == 'v' && f.Flag('#'):
		_, _ = io.WriteString(f, goS)
	case verb == 'q':
		_, _ = io.WriteString(f, strconv.Quote(s))
	default:
		_, _ = io.WriteString(f, s)
	}
}

// Copy returns a deep copy of o (nil for nil).
func (o *MountOptions) Copy() *MountOptions {
	if o == nil {
		return nil
	}
	c := &MountOptions{FSType: o.FSType}
	if o.MountFlags != nil {
		c.MountFlags = append([]string(nil), o.MountFlags...)
	}
	return c
}

// Merge returns o with the non-empty fields of p applied on top: p's fs type
// replaces o's when set, p's flags are appended. Neither input is modified.
func (o *MountOptions) Merge(p *MountOptions) *MountOptions {
	c := o.Copy()
	if p == nil {
		return c
	}
	if c == nil {
		return p.Copy()
	}
	if p.FSType != "" {
		c.FSType = p.FSType
	}
	c.MountFlags = append(c.MountFlags, p.MountFlags...)
	return c
}

// VolumeCapability is one way a volume can be used: an access mode, an
// attachment mode, and (for file-system attachment) mount options.
type VolumeCapability struct {
	AccessMode     AccessMode
	AttachmentMode AttachmentMode
	MountOptions   *MountOptions
}

// ParseVolumeCapability parses the kebab-case access and attachment mode
// names; the error names whichever is wrong.
func ParseVolumeCapability(accessMode, attachmentMode string) (VolumeCapability, error) {
	am, err := ParseAccessMode(accessMode)
	if err != nil {
		return VolumeCapability{}, err
	}
	at, err := ParseAttachmentMode(attachmentMode)
	if err != nil {
		return VolumeCapability{}, err
	}
	return VolumeCapability{AccessMode: am, AttachmentMode: at}, nil
}

// Validate reports whether both modes are known, and that mount options
// come only with file-system attachment.
func (c VolumeCapability) Validate() error {
	if !c.AccessMode.Valid() {
		return kinderr.Errorf(ErrInvalidCapability, "unknown access mode %s", c.AccessMode)
	}
	if !c.AttachmentMode.Valid() {
		return kinderr.Errorf(ErrInvalidCapability, "unknown attachment mode %s", c.AttachmentMode)
	}
	if c.AttachmentMode == AttachmentModeBlockDevice && c.MountOptions != nil &&
		(c.MountOptions.FSType != "" || len(c.MountOptions.MountFlags) > 0) {
		return kinderr.Errorf(ErrInvalidCapability, "mount options are only valid with file-system attachment")
	}
	return nil
}

// Matches reports whether c and o have the same access and attachment
// modes; mount options are not compared.
func (c VolumeCapability) Matches(o VolumeCapability) bool {
	return c.AccessMode == o.AccessMode && c.AttachmentMode == o.AttachmentMode
}

// String prints both modes and the redacted mount options.
func (c VolumeCapability) String() string {
	s := c.AccessMode.String() + "/" + c.AttachmentMode.String()
	if c.MountOptions != nil {
		s += " " + c.MountOptions.String()
	}
	return s
}

// GoString is String for %#v, so that debug printing redacts too.
func (c VolumeCapability) GoString() string { return "csi.VolumeCapability{" + c.String() + "}" }

// Format makes every fmt verb print the redacted form (see MountOptions.Format).
func (c VolumeCapability) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, c.String(), c.GoString())
}

// ToCSI converts c to its protobuf form.
func (c VolumeCapability) ToCSI() *csipb.VolumeCapability {
	vc := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: c.AccessMode.ToCSI()},
	}
	switch c.AttachmentMode {
	case AttachmentModeBlockDevice:
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	default:
		m := &csipb.VolumeCapability_MountVolume{}
		if c.MountOptions != nil {
			m.FsType = c.MountOptions.FSType
			m.MountFlags = append([]string(nil), c.MountOptions.MountFlags...)
			m.VolumeMountGroup = c.MountOptions.VolumeMountGroup
		}
		vc.AccessType = &csipb.VolumeCapability_Mount{Mount: m}
	}
	return vc
}

// VolumeCapabilityFromCSI converts a protobuf capability; a missing access
// mode or access type is an error.
func VolumeCapabilityFromCSI(vc *csipb.VolumeCapability) (VolumeCapability, error) {
	if vc == nil {
		return VolumeCapability{}, kinderr.Errorf(ErrInvalidCapability, "missing volume capability")
	}
	if vc.GetAccessMode() == nil {
		return VolumeCapability{}, kinderr.Errorf(ErrInvalidCapability, "missing access mode")
	}
	am, err := AccessModeFromCSI(vc.GetAccessMode().GetMode())
	if err != nil {
		return VolumeCapability{}, err
	}
	c := VolumeCapability{AccessMode: am}
	switch t := vc.GetAccessType().(type) {
	case *csipb.VolumeCapability_Block:
		c.AttachmentMode = AttachmentModeBlockDevice
	case *csipb.VolumeCapability_Mount:
		c.AttachmentMode = AttachmentModeFileSystem
		if m := t.Mount; m != nil && (m.GetFsType() != "" || len(m.GetMountFlags()) > 0) {
			c.MountOptions = &MountOptions{FSType: m.GetFsType(), MountFlags: append([]string(nil), m.GetMountFlags()...)}
		}
	default:
		return VolumeCapability{}, kinderr.Errorf(ErrInvalidCapability, "missing access type")
	}
	return c, nil
}
