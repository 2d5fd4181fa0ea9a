package runtime

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/snapshot"
	"github.com/csiactor/csiactor/actors/volume"
)

// The shapes the API and the managers show have no field for a secret, a
// mount flag or a publish context, in any type they hold (embedded records
// included): a record field of that kind added to a shared type fails
// here before it can reach a caller.
func TestShownShapes_NoSecretFields(t *testing.T) {
	forbidden := map[string]bool{
		"Secrets": true, "MountFlags": true, "PublishContext": true,
		"secrets": true, "mount_flags": true, "publish_context": true,
	}
	seen := map[reflect.Type]bool{}
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ.PkgPath() == "time" || seen[typ] {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if forbidden[f.Name] || forbidden[name] {
				t.Errorf("%s.%s (json %q) can show a secret or mount flags", path, f.Name, name)
			}
			walk(path+"."+f.Name, f.Type)
		}
	}
	for _, v := range []any{
		Volume{}, Claim{}, Snapshot{}, Plugin{}, Allocation{}, Event{}, ForcedRelease{}, FenceResult{},
		RedactedMountOptions{}, volume.Volume{}, volume.Claim{}, snapshot.Snapshot{},
	} {
		typ := reflect.TypeOf(v)
		walk(typ.String(), typ)
	}
}

// The JSON of the shapes the API answers with, to the byte: field names,
// order and what is left out when empty. A change to a shared type that
// alters the answers shows here.
func TestShownShapes_JSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"empty volume", Volume{}, `{"id":"","plugin":"","external_id":"","capabilities":null,"capacity_bytes":0,"claims":null,"past_claims":null}`},
		{"volume", Volume{
			ID: "v", Plugin: "p", ExternalID: "e",
			Capabilities:  []Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
			MountOptions:  &RedactedMountOptions{FSType: "ext4", MountFlagCount: 2},
			Parameters:    map[string]string{"k": "v"},
			Context:       map[string]string{"c": "d"},
			CapacityBytes: 42,
			Claims: []Claim{{Host: "h", Alloc: "a", Mode: ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system",
				State: ClaimPublished, TargetPath: "/t", LastError: "e", Repair: "target path", Condition: ClaimDegraded}},
			PastClaims:         []Claim{{Alloc: "b"}},
			Expansion:          &Expansion{CapacityBytes: 64, Step: "NodeExpandVolume"},
			AccessibleTopology: []map[string]string{{"zone": "z"}},
			Usage:              &VolumeUsage{CapacityBytes: 1, AvailableBytes: 2, UsedBytes: 3, Inodes: 4, InodesFree: 5, InodesUsed: 6, CheckedAt: at},
			Condition:          &VolumeCondition{Abnormal: true, Message: "m", CheckedAt: at},
		}, `{"id":"v","plugin":"p","external_id":"e","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}],` +
			`"mount_options":{"fs_type":"ext4","mount_flag_count":2},"parameters":{"k":"v"},"context":{"c":"d"},"capacity_bytes":42,` +
			`"claims":[{"host":"h","alloc":"a","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system","state":"published","target_path":"/t","last_error":"e","repair":"target path","condition":"degraded"}],` +
			`"past_claims":[{"alloc":"b","mode":"","access_mode":"","attachment_mode":"","state":"","target_path":""}],` +
			`"expansion":{"capacity_bytes":64,"step":"NodeExpandVolume"},"accessible_topology":[{"zone":"z"}],` +
			`"usage":{"capacity_bytes":1,"available_bytes":2,"used_bytes":3,"inodes":4,"inodes_free":5,"inodes_used":6,"checked_at":"2026-01-02T03:04:05Z"},` +
			`"condition":{"abnormal":true,"message":"m","checked_at":"2026-01-02T03:04:05Z"}}`},
		{"mount options without flags", RedactedMountOptions{}, `{"mount_flag_count":0}`},
		{"empty usage and condition", []any{VolumeUsage{}, VolumeCondition{}},
			`[{"checked_at":"0001-01-01T00:00:00Z"},{"abnormal":false,"checked_at":"0001-01-01T00:00:00Z"}]`},
		{"empty snapshot", Snapshot{}, `{"plugin":"","ready_to_use":false,"registered":false}`},
		{"snapshot", Snapshot{
			ID: "s", Plugin: "p", SourceVolume: "v", SourceExternalID: "ve", Parameters: map[string]string{"k": "v"},
			ExternalID: "se", SizeBytes: 7, CreationTime: at, ReadyToUse: true, State: snapshot.StateReady,
			LastError: "e", Attempts: 2, Restoring: 1, Registered: true, CreatedAt: at, UpdatedAt: at,
		}, `{"id":"s","plugin":"p","source_volume":"v","source_external_id":"ve","parameters":{"k":"v"},"external_id":"se","size_bytes":7,` +
			`"creation_time":"2026-01-02T03:04:05Z","ready_to_use":true,"state":"ready","last_error":"e","attempts":2,"restoring":1,"registered":true,` +
			`"created_at":"2026-01-02T03:04:05Z","updated_at":"2026-01-02T03:04:05Z"}`},
		{"allocation capabilities", Allocation{ID: "a", Capabilities: &Capabilities{
			Plugin: []string{"CONTROLLER_SERVICE"}, Controller: []string{"CREATE_DELETE_VOLUME"}, Node: []string{"STAGE_UNSTAGE_VOLUME"},
			Topology: map[string]string{"zone": "z"}, MaxVolumesPerNode: 3,
		}}, `{"id":"a","plugin":"","type":"","socket":"","healthy":false,"health_description":"","singleton":false,` +
			`"capabilities":{"plugin":["CONTROLLER_SERVICE"],"controller":["CREATE_DELETE_VOLUME"],"node":["STAGE_UNSTAGE_VOLUME"],"topology":{"zone":"z"},"max_volumes_per_node":3}}`},
		{"empty capabilities", Capabilities{}, `{"plugin":null}`},
	} {
		got, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// The request bodies the client sends carry the secrets and mount flags,
// and the printed (marshalled) specs do not, to the byte.
func TestSpecs_RequestJSON_Shape(t *testing.T) {
	vs := VolumeSpec{
		Plugin: "p", ExternalID: "e", Capabilities: []Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		MountOptions: &MountOptions{FSType: "ext4", MountFlags: []string{"password=hunter2"}},
		Parameters:   map[string]string{"k": "v"}, Context: map[string]string{"c": "d"}, Secrets: map[string]string{"key": "topsecret"},
	}
	ss := SnapshotSpec{ID: "s", Plugin: "p", SourceVolume: "v", Parameters: map[string]string{"k": "v"}, Secrets: map[string]string{"key": "topsecret"}}
	request := func(f func() ([]byte, error)) []byte {
		b, err := f()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	shown := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"volume spec request", request(vs.RequestJSON), `{"plugin":"p","external_id":"e","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}],` +
			`"mount_options":{"fs_type":"ext4","mount_flags":["password=hunter2"]},"parameters":{"k":"v"},"context":{"c":"d"},"secrets":{"key":"topsecret"}}`},
		{"volume spec request without mount options", request(VolumeSpec{Plugin: "p"}.RequestJSON), `{"plugin":"p","capabilities":null}`},
		{"volume spec shown", shown(vs), `{"plugin":"p","external_id":"e","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}],` +
			`"mount_options":{"fs_type":"ext4","mount_flag_count":1},"parameters":{"k":"v"},"context":{"c":"d"},"secret_count":1}`},
		{"snapshot spec request", request(ss.RequestJSON), `{"id":"s","plugin":"p","source_volume":"v","parameters":{"k":"v"},"secrets":{"key":"topsecret"}}`},
		{"snapshot spec shown", shown(ss), `{"id":"s","plugin":"p","source_volume":"v","parameters":{"k":"v"},"secret_count":1}`},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, tc.got, tc.want)
		}
	}
}
