package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/csi"
)

// wantFieldErr checks that err is a *FieldError for field that unwraps to
// ErrInvalid and whose message contains msg.
func wantFieldErr(t *testing.T, err error, field, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one for field %q", field)
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %q is %T, not a *FieldError", err, err)
	}
	if fe.Field != field {
		t.Errorf("error %q names field %q, want %q", err, fe.Field, field)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("error %q does not unwrap to ErrInvalid", err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not contain %q", err, msg)
	}
}

func TestValidateID_Cases(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"vol-1", true},
		{"csi.example.com", true},
		{"ns:vol_2", true},
		{strings.Repeat("x", MaxIDLength), true},
		{"", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"../etc", false},
		{"-flag", false},
		{".hidden", false},
		{"a b", false},
		{"vol\x00", false},
		{"ü", false},
		{strings.Repeat("x", MaxIDLength+1), false},
	} {
		err := ValidateID("id", tc.id)
		if tc.ok && err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", tc.id, err)
		}
		if !tc.ok {
			if err == nil {
				t.Errorf("ValidateID(%q) = nil, want an error", tc.id)
				continue
			}
			wantFieldErr(t, err, "id", "")
		}
	}
}

func TestAllocationSpec_Validate_Cases(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spec  AllocationSpec
		field string // empty: valid
		msg   string
	}{
		{"attached", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/run/p/csi.sock"}, "", ""},
		{"exec", AllocationSpec{Plugin: "p", Type: TypeMonolith, Command: []string{"/bin/p", "--endpoint={endpoint}"}, Env: map[string]string{"A": "1"}}, "", ""},
		{"no plugin", AllocationSpec{Type: TypeNode, Socket: "/s"}, "plugin", "must not be empty"},
		{"bad plugin", AllocationSpec{Plugin: "../p", Type: TypeNode, Socket: "/s"}, "plugin", "letters, digits"},
		{"bad type", AllocationSpec{Plugin: "p", Type: "worker", Socket: "/s"}, "type", `"worker": want controller, node or monolith`},
		{"neither", AllocationSpec{Plugin: "p", Type: TypeNode}, "socket", "give socket"},
		{"both", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/s", Command: []string{"x"}}, "socket", "not both"},
		{"relative socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "csi.sock"}, "socket", "not an absolute path"},
		{"url socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "unix:///csi.sock"}, "socket", "without unix://"},
		{"unclean socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/a/../b"}, "socket", "not a clean path"},
		{"long socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/" + strings.Repeat("s", MaxSocketPathLength)}, "socket", "108 bytes, over the 107-byte"},
		{"env with socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/s", Env: map[string]string{"A": "1"}}, "env", "only valid with command"},
		{"empty command", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{""}}, "command[0]", "must not be empty"},
		{"nul arg", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{"x", "a\x00"}}, "command[1]", "NUL"},
		{"bad env name", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{"x"}, Env: map[string]string{"A=B": "1"}}, "env", "must not contain '='"},
		{"empty env name", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{"x"}, Env: map[string]string{"": "1"}}, "env", "must not be empty"},
		{"nul env value", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{"x"}, Env: map[string]string{"TOKEN": "s3cret\x00"}}, "env.TOKEN", "NUL"},
		{"image", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "csi/hostpath:v1", Engine: "podman", Args: []string{"--endpoint={endpoint}"},
			Mounts: []container.Mount{{Source: "/srv", Target: "/srv"}}, Devices: []string{"/dev/fuse"}, Capabilities: []string{"SYS_ADMIN"}, Pull: "never"}}, "", ""},
		{"image unknown engine", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Engine: "rkt"}}, "image.engine", `"rkt" is not an engine: want docker or podman`},
		{"image bad pull", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Pull: "sometimes"}}, "image.pull", `"sometimes" is not a pull policy`},
		{"image relative mount", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Mounts: []container.Mount{{Source: "data", Target: "/data"}}}}, "image.mounts[0].source", `"data" is a relative path`},
		{"image relative mount target", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Mounts: []container.Mount{{Source: "/data", Target: "data"}}}}, "image.mounts[0].target", "relative path"},
		{"image relative device", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Devices: []string{"fuse"}}}, "image.devices[0]", "relative path"},
		{"image bad capability", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Capabilities: []string{"sys-admin"}}}, "image.capabilities[0]", "is not a Linux capability"},
		{"image without reference", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Engine: "docker"}}, "image.image", "is required"},
		{"image with command", AllocationSpec{Plugin: "p", Type: TypeNode, Command: []string{"/bin/p"}, Image: &container.Image{Image: "i"}}, "image", "not command and image"},
		{"image with socket", AllocationSpec{Plugin: "p", Type: TypeNode, Socket: "/s", Image: &container.Image{Image: "i"}}, "image", "not socket and image"},
		{"image with env", AllocationSpec{Plugin: "p", Type: TypeNode, Env: map[string]string{"A": "1"}, Image: &container.Image{Image: "i"}}, "env", "image.env"},
		{"image endpoint env", AllocationSpec{Plugin: "p", Type: TypeNode, Image: &container.Image{Image: "i", Env: map[string]string{"CSI_ENDPOINT": "x"}}}, "image.env", "set by the agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantFieldErr(t, err, tc.field, tc.msg)
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q repeats an env value", err)
			}
		})
	}
}

func validVolumeSpec() VolumeSpec {
	return VolumeSpec{
		Plugin:       "hostpath",
		ExternalID:   "ext-1",
		Capabilities: []Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		MountOptions: &MountOptions{FSType: "ext4", MountFlags: []string{"password=hunter2", "noatime"}},
		Parameters:   map[string]string{"tier": "fast"},
		Context:      map[string]string{"share": "a"},
		Secrets:      map[string]string{"apikey": "topsecret"},
	}
}

func TestVolumeSpec_Validate_Cases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*VolumeSpec)
		field  string
		msg    string
	}{
		{"valid", func(*VolumeSpec) {}, "", ""},
		{"block only without mount options", func(s *VolumeSpec) {
			s.Capabilities = []Capability{{"multi-node-multi-writer", "block-device"}}
			s.MountOptions = nil
		}, "", ""},
		{"no plugin", func(s *VolumeSpec) { s.Plugin = "" }, "plugin", "must not be empty"},
		{"no external id", func(s *VolumeSpec) { s.ExternalID = "" }, "external_id", "must not be empty"},
		{"long external id", func(s *VolumeSpec) { s.ExternalID = strings.Repeat("e", MaxExternalIDLength+1) }, "external_id", "longer than"},
		{"bad utf8 external id", func(s *VolumeSpec) { s.ExternalID = "\xff" }, "external_id", "UTF-8"},
		{"no capabilities", func(s *VolumeSpec) { s.Capabilities = nil }, "capabilities", "at least one"},
		{"bad access mode", func(s *VolumeSpec) {
			s.Capabilities = append(s.Capabilities, Capability{"single-node-writter", "file-system"})
		}, "capabilities[1].access_mode", `access mode "single-node-writter"`},
		{"bad attachment mode", func(s *VolumeSpec) { s.Capabilities[0].AttachmentMode = "fs" }, "capabilities[0].attachment_mode", `attachment mode "fs"`},
		{"duplicate capability", func(s *VolumeSpec) { s.Capabilities = append(s.Capabilities, s.Capabilities[0]) }, "capabilities[1]", "duplicate of capabilities[0]"},
		{"mount options with block only", func(s *VolumeSpec) { s.Capabilities[0].AttachmentMode = "block-device" }, "mount_options", "only valid with a file-system"},
		{"bad fs type", func(s *VolumeSpec) { s.MountOptions.FSType = "ext4,rw" }, "mount_options.fs_type", "not a file-system type"},
		{"empty mount flag", func(s *VolumeSpec) { s.MountOptions.MountFlags = append(s.MountOptions.MountFlags, "") }, "mount_options.mount_flags[2]", "non-empty"},
		{"nul mount flag", func(s *VolumeSpec) { s.MountOptions.MountFlags[0] = "password=hunter2\x00" }, "mount_options.mount_flags[0]", "NUL"},
		{"empty parameter key", func(s *VolumeSpec) { s.Parameters[""] = "x" }, "parameters", "keys must be non-empty"},
		{"nul context value", func(s *VolumeSpec) { s.Context["share"] = "a\x00" }, "context.share", "NUL"},
		{"nul secret value", func(s *VolumeSpec) { s.Secrets["apikey"] = "topsecret\x00" }, "secrets", "values must not contain NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validVolumeSpec()
			tc.modify(&s)
			err := s.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantFieldErr(t, err, tc.field, tc.msg)
			for _, secret := range []string{"hunter2", "topsecret", "apikey"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q repeats the secret %q", err, secret)
				}
			}
		})
	}
}

func TestVolumeSpec_Validate_WrapsCSIError(t *testing.T) {
	s := validVolumeSpec()
	s.Capabilities[0].AccessMode = "nope"
	if err := s.Validate(); !errors.Is(err, csi.ErrInvalidCapability) {
		t.Fatalf("Validate() = %v, want it to wrap csi.ErrInvalidCapability", err)
	}
}

func TestCreateVolumeSpec_Validate_Cases(t *testing.T) {
	base := func() CreateVolumeSpec {
		v := validVolumeSpec()
		v.ExternalID = ""
		return CreateVolumeSpec{ID: "vol1", VolumeSpec: v, CapacityBytes: 1 << 30}
	}
	for _, tc := range []struct {
		name   string
		modify func(*CreateVolumeSpec)
		field  string
		msg    string
	}{
		{"valid", func(*CreateVolumeSpec) {}, "", ""},
		{"zero capacity", func(s *CreateVolumeSpec) { s.CapacityBytes = 0 }, "", ""},
		{"no id", func(s *CreateVolumeSpec) { s.ID = "" }, "id", "must not be empty"},
		{"slash id", func(s *CreateVolumeSpec) { s.ID = "a/b" }, "id", "letters, digits"},
		{"external id", func(s *CreateVolumeSpec) { s.ExternalID = "x" }, "external_id", "chosen by the plugin"},
		{"negative capacity", func(s *CreateVolumeSpec) { s.CapacityBytes = -1 }, "capacity_bytes", "negative"},
		{"bad capability", func(s *CreateVolumeSpec) { s.Capabilities[0].AccessMode = "" }, "capabilities[0].access_mode", "access mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.modify(&s)
			err := s.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantFieldErr(t, err, tc.field, tc.msg)
		})
	}
}

func TestClaimRequest_Validate_Cases(t *testing.T) {
	ok := ClaimRequest{Alloc: "a1", Mode: ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system"}
	for _, tc := range []struct {
		name   string
		modify func(*ClaimRequest)
		field  string
		msg    string
	}{
		{"valid", func(*ClaimRequest) {}, "", ""},
		{"read on reader-only", func(r *ClaimRequest) { r.Mode, r.AccessMode = ModeRead, "multi-node-reader-only" }, "", ""},
		{"no alloc", func(r *ClaimRequest) { r.Alloc = "" }, "alloc", "must not be empty"},
		{"dotdot alloc", func(r *ClaimRequest) { r.Alloc = ".." }, "alloc", "letters, digits"},
		{"bad mode", func(r *ClaimRequest) { r.Mode = "rw" }, "mode", `"rw": want read or write`},
		{"bad access", func(r *ClaimRequest) { r.AccessMode = "x" }, "access_mode", "access mode"},
		{"bad attachment", func(r *ClaimRequest) { r.AttachmentMode = "" }, "attachment_mode", "attachment mode"},
		{"write on reader-only", func(r *ClaimRequest) { r.AccessMode = "single-node-reader-only" }, "mode", "write is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.modify(&r)
			err := r.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantFieldErr(t, err, tc.field, tc.msg)
		})
	}
}

func TestVolumeFilter_Validate_Cases(t *testing.T) {
	if err := (VolumeFilter{}).Validate(); err != nil {
		t.Errorf("empty filter: %v", err)
	}
	if err := (VolumeFilter{Plugin: "p", Node: "node-1"}).Validate(); err != nil {
		t.Errorf("valid filter: %v", err)
	}
	wantFieldErr(t, VolumeFilter{Plugin: "a/b"}.Validate(), "plugin", "letters")
	wantFieldErr(t, VolumeFilter{Node: "n\x00"}.Validate(), "node", "not a node ID")
}

func TestEvent_Validate_Cases(t *testing.T) {
	wantFieldErr(t, Event{Type: EventHealthChanged}.Validate(), "time", "must be set")
}

// Secrets and mount flags must not show in any printed or marshalled form
// of a spec: %v, %+v, %#v, %s and JSON.
func TestVolumeSpec_String_Redacts(t *testing.T) {
	s := validVolumeSpec()
	c := CreateVolumeSpec{ID: "v", VolumeSpec: s}
	j1, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	j2, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	j3, err := json.Marshal(s.MountOptions)
	if err != nil {
		t.Fatal(err)
	}
	outs := []string{
		fmt.Sprint(s), fmt.Sprintf("%+v", s), fmt.Sprintf("%#v", s), fmt.Sprintf("%v", &s),
		fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c),
		fmt.Sprint(s.MountOptions), fmt.Sprintf("%#v", s.MountOptions),
		string(j1), string(j2), string(j3),
	}
	for _, out := range outs {
		for _, secret := range []string{"hunter2", "noatime", "topsecret"} {
			if strings.Contains(out, secret) {
				t.Errorf("%s shows %q", out, secret)
			}
		}
	}
	if !strings.Contains(string(j1), `"secret_count":1`) || !strings.Contains(string(j1), `"mount_flag_count":2`) {
		t.Errorf("redacted JSON %s lacks the counts", j1)
	}
	if !strings.Contains(string(j2), `"id":"v"`) || !strings.Contains(string(j2), `"plugin":"hostpath"`) {
		t.Errorf("redacted create JSON %s lacks its fields", j2)
	}
	if !strings.Contains(fmt.Sprint(s), "secrets=[1 redacted]") || !strings.Contains(fmt.Sprint(s), "mount_flags=[2 redacted]") {
		t.Errorf("String() = %s, want the redaction counts", s)
	}
}

// RequestJSON carries everything, and decodes back to the same spec.
func TestVolumeSpec_RequestJSON_RoundTrip(t *testing.T) {
	s := validVolumeSpec()
	b, err := s.RequestJSON()
	if err != nil {
		t.Fatal(err)
	}
	var got VolumeSpec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(s) || got.Secrets["apikey"] != "topsecret" || got.MountOptions.MountFlags[0] != "password=hunter2" {
		t.Errorf("round trip: got %#v (secret %q, flags %d)", got, got.Secrets["apikey"], len(got.MountOptions.MountFlags))
	}

	c := CreateVolumeSpec{ID: "v", VolumeSpec: s, CapacityBytes: 42}
	c.ExternalID = ""
	b, err = c.RequestJSON()
	if err != nil {
		t.Fatal(err)
	}
	var gotc CreateVolumeSpec
	if err := json.Unmarshal(b, &gotc); err != nil {
		t.Fatal(err)
	}
	if gotc.ID != "v" || gotc.CapacityBytes != 42 || gotc.Secrets["apikey"] != "topsecret" || len(gotc.MountOptions.MountFlags) != 2 {
		t.Errorf("create round trip: got %#v", gotc)
	}
}

func TestFieldError_Prefixed(t *testing.T) {
	for _, tc := range []struct{ prefix, field, want string }{
		{"allocations[1]", "type", "allocations[1].type"},
		{"capabilities", "[0]", "capabilities[0]"},
		{"volumes.retry", "", "volumes.retry"},
	} {
		err := prefixed(tc.prefix, fieldErr(tc.field, "bad"))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.want {
			t.Errorf("prefixed(%q, %q) = %v, want field %q", tc.prefix, tc.field, err, tc.want)
		}
	}
	plain := errors.New("x")
	if prefixed("p", plain) != plain {
		t.Error("prefixed changed a non-field error")
	}
}
