package dockerplugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestCreateSpec_Mapping(t *testing.T) {
	drv := runtime.DockerDriver{Name: "csi", Plugin: "p"}
	for _, tc := range []struct {
		opts       map[string]string
		access     string
		attachment string
	}{
		{nil, "single-node-writer", "file-system"},
		{map[string]string{"sharing": "none"}, "single-node-writer", "file-system"},
		{map[string]string{"sharing": "readonly"}, "single-node-reader-only", "file-system"},
		{map[string]string{"sharing": "onewriter"}, "single-node-multi-writer", "file-system"},
		{map[string]string{"sharing": "all", "scope": "single"}, "single-node-multi-writer", "file-system"},
		{map[string]string{"scope": "multi", "sharing": "readonly"}, "multi-node-reader-only", "file-system"},
		{map[string]string{"scope": "multi", "sharing": "onewriter"}, "multi-node-single-writer", "file-system"},
		{map[string]string{"scope": "multi", "sharing": "all", "type": "block"}, "multi-node-multi-writer", "block-device"},
	} {
		spec, err := createSpec(drv, "v", tc.opts)
		if err != nil {
			t.Errorf("%v: %v", tc.opts, err)
			continue
		}
		if c := spec.Capabilities[0]; c.AccessMode != tc.access || c.AttachmentMode != tc.attachment {
			t.Errorf("%v: capability %+v, want %s %s", tc.opts, c, tc.access, tc.attachment)
		}
	}
	spec, err := createSpec(drv, "v", map[string]string{"topology-required": "zone=a,rack=1", "size": "1.5GiB", "mirror": "2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Topology) != 1 || spec.Topology[0]["zone"] != "a" || spec.Topology[0]["rack"] != "1" ||
		spec.CapacityBytes != 3<<29 || spec.Parameters["mirror"] != "2" {
		t.Errorf("spec = %+v", spec)
	}
}

// FuzzCreateSpec: any options give a valid spec or an invalid-argument
// error, never a panic, and an error never shows a value.
func FuzzCreateSpec(f *testing.F) {
	f.Add("size", "1GiB", "sharing", "all")
	f.Add("scope", "multi", "type", "block")
	f.Add("external-id", "x", "context.k", "v")
	f.Add("topology-required", "a=b,c", "fs-type", "ext4")
	f.Add("secret_x", "v", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		opts := map[string]string{k1: v1, k2: v2}
		spec, err := createSpec(runtime.DockerDriver{Name: "csi", Plugin: "p"}, "v", opts)
		if err != nil {
			if !errors.Is(err, runtime.ErrInvalid) {
				t.Fatalf("%v: error %v is not ErrInvalid", opts, err)
			}
			for _, v := range []string{v1, v2} {
				if len(v) > 8 && strings.Contains(err.Error(), v) && !strings.Contains(k1+k2, v) {
					if strings.HasPrefix(strings.ToLower(k1), "secret") || strings.HasPrefix(strings.ToLower(k2), "secret") {
						t.Fatalf("error shows a secret value: %v", err)
					}
				}
			}
			return
		}
		if len(spec.Capabilities) != 1 {
			t.Fatalf("%v: %d capabilities", opts, len(spec.Capabilities))
		}
		if spec.ExternalID != "" {
			err = spec.VolumeSpec.Validate()
		} else {
			err = spec.Validate()
		}
		if err != nil {
			t.Fatalf("%v: spec does not validate: %v", opts, err)
		}
	})
}
