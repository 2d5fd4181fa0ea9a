package csi

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
)

var allAccessModes = []AccessMode{
	AccessModeSingleNodeReaderOnly, AccessModeSingleNodeWriter, AccessModeSingleNodeSingleWriter,
	AccessModeSingleNodeMultiWriter, AccessModeMultiNodeReaderOnly, AccessModeMultiNodeSingleWriter,
	AccessModeMultiNodeMultiWriter,
}

func TestAccessMode_ParseString_RoundTrip(t *testing.T) {
	for _, m := range allAccessModes {
		t.Run(m.String(), func(t *testing.T) {
			got, err := ParseAccessMode(m.String())
			if err != nil || got != m {
				t.Fatalf("ParseAccessMode(%q) = %v, %v", m.String(), got, err)
			}
			back, err := AccessModeFromCSI(m.ToCSI())
			if err != nil || back != m {
				t.Fatalf("AccessModeFromCSI(%v) = %v, %v", m.ToCSI(), back, err)
			}
			if !m.Valid() {
				t.Fatal("Valid() = false")
			}
		})
	}
}

func TestAccessMode_ReadOnly(t *testing.T) {
	var ro []AccessMode
	for _, m := range allAccessModes {
		if m.ReadOnly() {
			ro = append(ro, m)
		}
	}
	if want := []AccessMode{AccessModeSingleNodeReaderOnly, AccessModeMultiNodeReaderOnly}; !slices.Equal(ro, want) {
		t.Fatalf("read-only modes = %v, want %v", ro, want)
	}
}

func TestParseAccessMode_Invalid(t *testing.T) {
	for _, s := range []string{"", "unknown", "SINGLE_NODE_WRITER", "single-node-writer ", "single_node_writer", "rw"} {
		t.Run(fmt.Sprintf("%q", s), func(t *testing.T) {
			m, err := ParseAccessMode(s)
			if !errors.Is(err, ErrInvalidCapability) || m != AccessModeUnknown {
				t.Fatalf("ParseAccessMode(%q) = %v, %v; want ErrInvalidCapability", s, m, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) || !strings.Contains(err.Error(), "single-node-writer") {
				t.Fatalf("error %q should name the value and the valid modes", err)
			}
		})
	}
}

func TestAccessMode_String_OutOfRange(t *testing.T) {
	tests := []struct {
		m        AccessMode
		str, gos string
	}{
		{AccessModeUnknown, "unknown", "csi.AccessMode(unknown)"},
		{AccessModeMultiNodeMultiWriter, "multi-node-multi-writer", "csi.AccessMode(multi-node-multi-writer)"},
		{AccessMode(-1), "access-mode(-1)", "csi.AccessMode(access-mode(-1))"},
		{AccessMode(99), "access-mode(99)", "csi.AccessMode(access-mode(99))"},
	}
	for _, tt := range tests {
		if got := tt.m.String(); got != tt.str {
			t.Errorf("String() = %q, want %q", got, tt.str)
		}
		if got := fmt.Sprintf("%#v", tt.m); got != tt.gos {
			t.Errorf("%%#v = %q, want %q", got, tt.gos)
		}
		if tt.m.Valid() != (tt.m == AccessModeMultiNodeMultiWriter) {
			t.Errorf("%v.Valid() = %v", tt.m, tt.m.Valid())
		}
		if !tt.m.Valid() && tt.m.ToCSI() != csipb.VolumeCapability_AccessMode_UNKNOWN {
			t.Errorf("%v.ToCSI() = %v, want UNKNOWN", tt.m, tt.m.ToCSI())
		}
	}
}

func TestAccessModeFromCSI_Unknown(t *testing.T) {
	for _, pm := range []csipb.VolumeCapability_AccessMode_Mode{csipb.VolumeCapability_AccessMode_UNKNOWN, 99, -1} {
		if m, err := AccessModeFromCSI(pm); !errors.Is(err, ErrInvalidCapability) || m != AccessModeUnknown {
			t.Errorf("AccessModeFromCSI(%d) = %v, %v", pm, m, err)
		}
	}
}

func TestAttachmentMode_Parse(t *testing.T) {
	tests := []struct {
		in      string
		want    AttachmentMode
		wantErr bool
	}{
		{"block-device", AttachmentModeBlockDevice, false},
		{"file-system", AttachmentModeFileSystem, false},
		{"", AttachmentModeUnknown, true},
		{"unknown", AttachmentModeUnknown, true},
		{"filesystem", AttachmentModeUnknown, true},
	}
	for _, tt := range tests {
		got, err := ParseAttachmentMode(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrInvalidCapability)) {
			t.Errorf("ParseAttachmentMode(%q) = %v, %v", tt.in, got, err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
	if got := AttachmentMode(7).String(); got != "attachment-mode(7)" {
		t.Errorf("String() = %q", got)
	}
}

func TestParseVolumeCapability_NamesTheBadField(t *testing.T) {
	if _, err := ParseVolumeCapability("single-node-writer", "nfs"); err == nil || !strings.Contains(err.Error(), "attachment mode") {
		t.Errorf("bad attachment mode: %v", err)
	}
	if _, err := ParseVolumeCapability("rwx", "file-system"); err == nil || !strings.Contains(err.Error(), "access mode") {
		t.Errorf("bad access mode: %v", err)
	}
	c, err := ParseVolumeCapability("multi-node-reader-only", "block-device")
	if err != nil || c != (VolumeCapability{AccessMode: AccessModeMultiNodeReaderOnly, AttachmentMode: AttachmentModeBlockDevice}) {
		t.Errorf("ParseVolumeCapability = %v, %v", c, err)
	}
}

func TestVolumeCapability_CSI_RoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   VolumeCapability
		want VolumeCapability // after ToCSI then FromCSI
	}{
		{"block", VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice},
			VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice}},
		{"file system without options", VolumeCapability{AccessMode: AccessModeMultiNodeMultiWriter, AttachmentMode: AttachmentModeFileSystem},
			VolumeCapability{AccessMode: AccessModeMultiNodeMultiWriter, AttachmentMode: AttachmentModeFileSystem}},
		{"file system with empty options", VolumeCapability{AccessMode: AccessModeSingleNodeReaderOnly, AttachmentMode: AttachmentModeFileSystem, MountOptions: &MountOptions{}},
			VolumeCapability{AccessMode: AccessModeSingleNodeReaderOnly, AttachmentMode: AttachmentModeFileSystem}},
		{"file system with options", VolumeCapability{AccessMode: AccessModeSingleNodeSingleWriter, AttachmentMode: AttachmentModeFileSystem,
			MountOptions: &MountOptions{FSType: "xfs", MountFlags: []string{"noatime", "password=hunter2"}}},
			VolumeCapability{AccessMode: AccessModeSingleNodeSingleWriter, AttachmentMode: AttachmentModeFileSystem,
				MountOptions: &MountOptions{FSType: "xfs", MountFlags: []string{"noatime", "password=hunter2"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pb := tt.in.ToCSI()
			got, err := VolumeCapabilityFromCSI(pb)
			if err != nil {
				t.Fatalf("FromCSI: %s", err)
			}
			if !got.Matches(tt.want) || !equalOptions(got.MountOptions, tt.want.MountOptions) {
				t.Fatalf("round trip = %#v (flags %q), want %#v", got, flagsOf(got), tt.want)
			}
			if tt.in.MountOptions != nil && len(tt.in.MountOptions.MountFlags) > 0 {
				pb.GetMount().MountFlags[0] = "changed"
				if tt.in.MountOptions.MountFlags[0] == "changed" || got.MountOptions.MountFlags[0] == "changed" {
					t.Fatal("ToCSI/FromCSI share the mount flags slice")
				}
			}
		})
	}
}

func equalOptions(a, b *MountOptions) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.FSType == b.FSType && slices.Equal(a.MountFlags, b.MountFlags)
}

func flagsOf(c VolumeCapability) []string {
	if c.MountOptions == nil {
		return nil
	}
	return c.MountOptions.MountFlags
}

func TestVolumeCapabilityFromCSI_Invalid(t *testing.T) {
	mode := &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	tests := []struct {
		name string
		in   *csipb.VolumeCapability
		want string
	}{
		{"nil", nil, "missing volume capability"},
		{"no access mode", &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}}, "missing access mode"},
		{"unknown access mode", &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{}, AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}}, "CSI access mode 0"},
		{"no access type", &csipb.VolumeCapability{AccessMode: mode}, "missing access type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := VolumeCapabilityFromCSI(tt.in)
			if !errors.Is(err, ErrInvalidCapability) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidCapability mentioning %q", err, tt.want)
			}
		})
	}
}

func TestVolumeCapability_Validate(t *testing.T) {
	tests := []struct {
		name string
		c    VolumeCapability
		want string // "" for valid
	}{
		{"valid block", VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice}, ""},
		{"valid fs", VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeFileSystem, MountOptions: &MountOptions{FSType: "ext4"}}, ""},
		{"block with empty options", VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice, MountOptions: &MountOptions{}}, ""},
		{"no access mode", VolumeCapability{AttachmentMode: AttachmentModeFileSystem}, "access mode"},
		{"no attachment mode", VolumeCapability{AccessMode: AccessModeSingleNodeWriter}, "attachment mode"},
		{"block with flags", VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice, MountOptions: &MountOptions{MountFlags: []string{"ro"}}}, "only valid with file-system"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %s", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidCapability) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidCapability mentioning %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "ro]") {
				t.Fatalf("error prints mount flags: %s", err)
			}
		})
	}
}

func TestMountOptions_Merge(t *testing.T) {
	base := &MountOptions{FSType: "ext4", MountFlags: []string{"a"}}
	got := base.Merge(&MountOptions{MountFlags: []string{"b"}})
	if got.FSType != "ext4" || !slices.Equal(got.MountFlags, []string{"a", "b"}) {
		t.Fatalf("Merge = %q %q", got.FSType, got.MountFlags)
	}
	got.MountFlags[0] = "x"
	if base.MountFlags[0] != "a" {
		t.Fatal("Merge modified its receiver")
	}
	if got := base.Merge(&MountOptions{FSType: "xfs"}); got.FSType != "xfs" {
		t.Fatalf("Merge fs type = %q", got.FSType)
	}
	if got := (*MountOptions)(nil).Merge(base); !equalOptions(got, base) || got == base {
		t.Fatal("nil.Merge(p) should be a copy of p")
	}
	if (*MountOptions)(nil).Merge(nil) != nil {
		t.Fatal("nil.Merge(nil) should be nil")
	}
}

// TestVolumeCapability_Format_NeverPrintsMountFlags prints the capability
// model every way fmt can and checks the flags never appear.
func TestVolumeCapability_Format_NeverPrintsMountFlags(t *testing.T) {
	const flag = "password=hunter2"
	opts := &MountOptions{FSType: "cifs", MountFlags: []string{flag, "uid=1000"}}
	c := VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeFileSystem, MountOptions: opts}
	type wrapper struct {
		Cap  VolumeCapability
		Opts MountOptions
		Ptr  *VolumeCapability
	}
	values := map[string]any{
		"capability":         c,
		"*capability":        &c,
		"*options":           opts,
		"options value":      *opts,
		"struct of them":     wrapper{Cap: c, Opts: *opts, Ptr: &c},
		"slice of caps":      []VolumeCapability{c, c},
		"map of options":     map[string]*MountOptions{"a": opts},
		"nil *options":       (*MountOptions)(nil),
		"capability no opts": VolumeCapability{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice},
	}
	for name, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%10.3v"} {
			out := fmt.Sprintf(verb, v)
			if strings.Contains(out, "hunter2") || strings.Contains(out, "uid=1000") || strings.Contains(out, fmt.Sprintf("%x", flag)) {
				t.Errorf("%s with %s prints a mount flag: %s", name, verb, out)
			}
		}
	}
	if got := fmt.Sprint(c); got != `single-node-writer/file-system fs_type="cifs" mount_flags=[2 redacted]` {
		t.Errorf("Sprint = %s", got)
	}
	if got := fmt.Sprintf("%#v", c); got != `csi.VolumeCapability{single-node-writer/file-system fs_type="cifs" mount_flags=[2 redacted]}` {
		t.Errorf("%%#v = %s", got)
	}
	if got := fmt.Sprint((*MountOptions)(nil)); got != "<nil>" {
		t.Errorf("nil options print %q", got)
	}
}

// FuzzParseAccessMode: every input either parses to a valid mode whose name
// is the input, or fails with ErrInvalidCapability.
func FuzzParseAccessMode(f *testing.F) {
	for _, m := range allAccessModes {
		f.Add(m.String())
	}
	for _, s := range []string{"", "unknown", "single-node", "SINGLE_NODE_WRITER", "multi-node-multi-writer\x00", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseAccessMode(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidCapability) || m != AccessModeUnknown {
				t.Fatalf("ParseAccessMode(%q) = %v, %v", s, m, err)
			}
			return
		}
		if !m.Valid() || m.String() != s {
			t.Fatalf("ParseAccessMode(%q) = %v (valid %v)", s, m, m.Valid())
		}
		if back, err := AccessModeFromCSI(m.ToCSI()); err != nil || back != m {
			t.Fatalf("CSI round trip of %v = %v, %v", m, back, err)
		}
	})
}

// FuzzVolumeCapability decodes arbitrary bytes as a protobuf
// VolumeCapability: conversion never panics, a converted capability
// survives ToCSI/FromCSI unchanged, and its printed form does not depend on
// the mount flags' content.
func FuzzVolumeCapability(f *testing.F) {
	seeds := []VolumeCapability{
		{AccessMode: AccessModeSingleNodeWriter, AttachmentMode: AttachmentModeBlockDevice},
		{AccessMode: AccessModeMultiNodeReaderOnly, AttachmentMode: AttachmentModeFileSystem},
		{AccessMode: AccessModeSingleNodeMultiWriter, AttachmentMode: AttachmentModeFileSystem,
			MountOptions: &MountOptions{FSType: "nfs", MountFlags: []string{"vers=4", "password=x"}}},
	}
	for _, c := range seeds {
		b, err := proto.Marshal(c.ToCSI())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var pb csipb.VolumeCapability
		if proto.Unmarshal(b, &pb) != nil {
			return
		}
		c, err := VolumeCapabilityFromCSI(&pb)
		if err != nil {
			if !errors.Is(err, ErrInvalidCapability) {
				t.Fatalf("FromCSI error %v is not ErrInvalidCapability", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("FromCSI returned a capability that fails Validate: %s", err)
		}
		back, err := VolumeCapabilityFromCSI(c.ToCSI())
		if err != nil || !back.Matches(c) || !equalOptions(back.MountOptions, c.MountOptions) {
			t.Fatalf("round trip of %#v = %#v, %v", c, back, err)
		}
		if c.MountOptions != nil {
			blank := VolumeCapability{AccessMode: c.AccessMode, AttachmentMode: c.AttachmentMode,
				MountOptions: &MountOptions{FSType: c.MountOptions.FSType, MountFlags: make([]string, len(c.MountOptions.MountFlags))}}
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d"} {
				if got, want := fmt.Sprintf(verb, c), fmt.Sprintf(verb, blank); got != want {
					t.Fatalf("%s output depends on mount flags: %q vs %q", verb, got, want)
				}
			}
		}
	})
}
