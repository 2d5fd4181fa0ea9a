package registration

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The bytes the kubelet's api.proto gives these messages, written out by
// hand from its field numbers and types (tag = field number << 3 | wire
// type 2 for strings, 0 for bools).
var (
	wirePluginInfo = []byte("\x0a\x09CSIPlugin" + // 1: type
		"\x12\x0bdrv.example" + // 2: name
		"\x1a\x0d/run/csi.sock" + // 3: endpoint
		"\x22\x051.0.0\x22\x051.2.0") // 4: supported_versions, repeated
	wireStatus = []byte("\x08\x01" + // 1: plugin_registered
		"\x12\x04nope") // 2: error
)

func TestWire_PluginInfo(t *testing.T) {
	info := PluginInfo{Type: TypeCSIPlugin, Name: "drv.example", Endpoint: "/run/csi.sock", SupportedVersions: []string{"1.0.0", "1.2.0"}}
	got, err := proto.MarshalOptions{Deterministic: true}.Marshal(info.message())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wirePluginInfo) {
		t.Errorf("PluginInfo encodes as %q, want %q", got, wirePluginInfo)
	}
	m := dynamicpb.NewMessage(mustDescs().info)
	if err := proto.Unmarshal(wirePluginInfo, m); err != nil {
		t.Fatal(err)
	}
	back := pluginInfoFrom(m)
	if back.Type != info.Type || back.Name != info.Name || back.Endpoint != info.Endpoint || !slices.Equal(back.SupportedVersions, info.SupportedVersions) {
		t.Errorf("decoded %+v, want %+v", back, info)
	}
}

func TestWire_RegistrationStatus(t *testing.T) {
	got, err := proto.MarshalOptions{Deterministic: true}.Marshal(RegistrationStatus{PluginRegistered: true, Error: "nope"}.message())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wireStatus) {
		t.Errorf("RegistrationStatus encodes as %q, want %q", got, wireStatus)
	}
	m := dynamicpb.NewMessage(mustDescs().status)
	if err := proto.Unmarshal(wireStatus, m); err != nil {
		t.Fatal(err)
	}
	if s := registrationStatusFrom(m); !s.PluginRegistered || s.Error != "nope" {
		t.Errorf("decoded %+v", s)
	}
	// The zero status is empty on the wire, as proto3 has it.
	if b, _ := proto.Marshal(RegistrationStatus{}.message()); len(b) != 0 {
		t.Errorf("zero status encodes as %q", b)
	}
}

func TestSpeaksCSI1(t *testing.T) {
	for v, want := range map[string]bool{
		"1": true, "1.0": true, "1.0.0": true, "v1.5.0": true, "1.13.0": true,
		"0.3.0": false, "2.0.0": false, "": false, "1.0.0.0": false, "1.x": false, "01.0": false, "v": false, "1.0.0-rc1": false,
	} {
		if got := speaksCSI1([]string{v}); got != want {
			t.Errorf("speaksCSI1(%q) = %v, want %v", v, got, want)
		}
	}
}

// FuzzCheckInfo checks that whatever a registrar announces, the check
// never panics, and a driver it lets through has a name, a CSI 1.x
// version and a clean absolute endpoint.
func FuzzCheckInfo(f *testing.F) {
	f.Add("CSIPlugin", "drv", "unix:///run/csi.sock", "1.0.0")
	f.Add("CSIPlugin", "drv", "", "v1")
	f.Add("DevicePlugin", "", "../x", "0.3.0")
	f.Fuzz(func(t *testing.T, typ, name, endpoint, version string) {
		d, err := checkInfo(PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: []string{version}}, "/reg/r.sock")
		if err != nil {
			if !strings.HasPrefix(err.Error(), ErrRefused.Error()+": ") {
				t.Fatalf("error %q does not wrap ErrRefused first", err)
			}
			return
		}
		if d.Name == "" || !speaksCSI1(d.Versions) || !strings.HasPrefix(d.Endpoint, "/") {
			t.Fatalf("accepted %+v", d)
		}
	})
}
