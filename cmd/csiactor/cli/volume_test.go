package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

func TestVolumeList_Cases(t *testing.T) {
	_, env := populated(t)
	runCLI(t, env, "volume", "list").want(t, 0,
		"ID    PLUGIN    EXTERNAL ID  CAPACITY  CLAIMS  PAST CLAIMS\n"+
			"vol1  hostpath  ext-1        -         1       0\n"+
			"vol2  hostpath  ext-vol2     1 GiB     0       0\n")
	runCLI(t, env, "volume", "list", "-plugin", "nfs").want(t, 0, "ID  PLUGIN  EXTERNAL ID  CAPACITY  CLAIMS  PAST CLAIMS\n")
	r := runCLI(t, env, "volume", "list", "-node", "node-1", "-json")
	r.want(t, 0, "")
	var vs []runtime.Volume
	if err := json.Unmarshal([]byte(r.stdout), &vs); err != nil || len(vs) != 1 || vs[0].ID != "vol1" {
		t.Errorf("volume list -node -json = %+v, %v", vs, err)
	}
	r = runCLI(t, env, "volume", "list", "-plugin", "a/b")
	r.want(t, 2, "")
	r.contains(t, "stderr", `csiactor volume list: -plugin: "a/b"`)
}

func TestVolumeStatus_Table(t *testing.T) {
	_, env := populated(t)
	runCLI(t, env, "volume", "status", "vol1").want(t, 0,
		"ID             vol1\n"+
			"Plugin         hostpath\n"+
			"External ID    ext-1\n"+
			"Capacity       -\n"+
			"Capabilities   single-node-writer/file-system\n"+
			"Mount options  fs_type=ext4, 1 mount flag (not shown)\n"+
			"Parameters     tier=fast\n"+
			"Context        -\n"+
			"\n"+
			"Claims\n"+
			"ALLOC  MODE   ACCESS MODE         ATTACHMENT   STATE      TARGET PATH                                                                                LAST ERROR\n"+
			"web-1  write  single-node-writer  file-system  published  /var/lib/csiactor/volumes/hostpath/per-alloc/web-1/vol1/rw-file-system-single-node-writer  -\n"+
			"\n"+
			"Past claims: none\n")
}

// No output form of a volume shows its secrets or mount flags.
func TestVolumeStatus_NoSecrets(t *testing.T) {
	_, env := populated(t)
	for _, args := range [][]string{
		{"volume", "status", "vol1"}, {"volume", "status", "vol1", "-json"}, {"volume", "list", "-json"}, {"events"}, {"events", "-json"},
	} {
		r := runCLI(t, env, args...)
		r.want(t, 0, "")
		for _, s := range []string{"hunter2", "topsecret", "apikey"} {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("%v shows %q", args, s)
			}
		}
	}
}

func TestVolumeRegister_Flags(t *testing.T) {
	b, env := populated(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(secrets, []byte("# creds\nuser=admin\n\npassword = pa=ss\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, "volume", "register", "-plugin", "hostpath", "-external-id", "ext-9",
		"-capability", "single-node-writer", "-capability", "multi-node-reader-only:file-system",
		"-fs-type", "xfs", "-mount-flag", "noatime", "-mount-flag", "password=hunter2",
		"-parameter", "tier=slow", "-context", "share=s9", "-secret", "token=topsecret", "-secrets-file", secrets, "vol9")
	r.want(t, 0, "Registered volume vol9 (plugin hostpath, external ID ext-9)\n")
	got, ok := b.ReceivedVolumeSpec("vol9")
	want := runtime.VolumeSpec{
		Plugin: "hostpath", ExternalID: "ext-9",
		Capabilities: []runtime.Capability{
			{AccessMode: "single-node-writer", AttachmentMode: "file-system"},
			{AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"},
		},
		MountOptions: &runtime.MountOptions{FSType: "xfs", MountFlags: []string{"noatime", "password=hunter2"}},
		Parameters:   map[string]string{"tier": "slow"},
		Context:      map[string]string{"share": "s9"},
		// A secrets file line's key is trimmed; its value is kept as is.
		Secrets: map[string]string{"token": "topsecret", "user": "admin", "password": " pa=ss"},
	}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("backend received\n%#v\nsecrets %q flags %q\nwant\n%#v", got, got.Secrets, got.MountOptions.MountFlags, want)
	}
	if strings.Contains(r.stdout+r.stderr, "topsecret") {
		t.Error("output shows a secret")
	}
	// -json prints the volume as the API returns it.
	r = runCLI(t, env, "volume", "register", "-plugin", "hostpath", "-external-id", "ext-8", "-capability", "single-node-writer:block-device", "-json", "vol8")
	r.want(t, 0, "")
	var v runtime.Volume
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.ID != "vol8" || v.Capabilities[0].AttachmentMode != "block-device" {
		t.Errorf("register -json = %+v, %v", v, err)
	}
}

func TestVolumeRegister_Errors(t *testing.T) {
	_, env := populated(t)
	dir := t.TempDir()
	badSecrets := filepath.Join(dir, "bad")
	if err := os.WriteFile(badSecrets, []byte("ok=1\ntopsecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"volume", "register", "-plugin", "hostpath", "-external-id", "e", "-capability", "single-node-writer"}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no plugin", []string{"volume", "register", "-external-id", "e", "-capability", "single-node-writer", "v"}, 2, "-plugin is required"},
		{"no capability", []string{"volume", "register", "-plugin", "hostpath", "-external-id", "e", "v"}, 2, "give at least one -capability"},
		{"no external id", []string{"volume", "register", "-plugin", "hostpath", "-capability", "single-node-writer", "v"}, 2, "-external-id is required"},
		{"bad secret", append(base, "-secret", "topsecret", "v"), 2, "-secret: want KEY=VALUE (value not shown)"},
		{"duplicate secret", append(base, "-secret", "k=topsecret", "-secret", "k=x", "v"), 2, `-secret: key "k" given twice`},
		{"bad secrets file", append(base, "-secrets-file", badSecrets, "v"), 1, "line 2: want KEY=VALUE"},
		{"missing secrets file", append(base, "-secrets-file", filepath.Join(dir, "none"), "v"), 1, "no such file"},
		{"bad parameter", append(base, "-parameter", "x", "v"), 2, `invalid value "x" for flag -parameter`},
		{"bad access mode", []string{"volume", "register", "-plugin", "hostpath", "-external-id", "e", "-capability", "single-writer", "v"}, 2, `-capability #1: unknown access mode "single-writer"`},
		{"bad attachment mode", append(base, "-capability", "multi-node-multi-writer:disk", "v"), 2, `-capability #2: unknown attachment mode "disk"`},
		{"duplicate capability", append(base, "-capability", "single-node-writer:file-system", "v"), 2, "-capability #2: duplicate"},
		{"mount flags on block", []string{"volume", "register", "-plugin", "hostpath", "-external-id", "e", "-capability", "single-node-writer:block-device", "-mount-flag", "topsecret", "v"}, 2, "-fs-type/-mount-flag: only valid with a file-system capability"},
		{"bad fs type", append(base, "-fs-type", "ext4;rm", "v"), 2, `-fs-type: "ext4;rm" is not a file-system type name`},
		{"bad id", append(base, "a/b"), 2, `ID: "a/b": use letters`},
		{"claimed id taken", append(base, "vol1"), 1, "different definition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, env, tc.args...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
			if strings.Contains(r.stderr, "topsecret") {
				t.Errorf("stderr shows a secret: %s", r.stderr)
			}
		})
	}
}

func TestVolumeCreate_Cases(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capacity", "1.5GiB", "-capability", "single-node-writer", "-secret", "k=v", "vol3").
		want(t, 0, "Created volume vol3 (plugin hostpath, external ID ext-vol3, capacity 1.5 GiB)\n")
	v, err := b.Volume(context.Background(), "vol3")
	if err != nil || v.CapacityBytes != 3<<29 {
		t.Errorf("created %+v, %v", v, err)
	}
	if s, _ := b.ReceivedVolumeSpec("vol3"); s.Secrets["k"] != "v" {
		t.Errorf("secrets = %v", s.Secrets)
	}
	r := runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capacity", "10X", "-capability", "single-node-writer", "vol4")
	r.want(t, 2, "")
	r.contains(t, "stderr", `-capacity "10X": want a size like 1GiB, 500MB or 4096`)
	r = runCLI(t, env, "volume", "create", "-plugin", "nfs", "-capability", "single-node-writer", "vol4")
	r.want(t, 1, "")
	r.contains(t, "stderr", `plugin "nfs" has no healthy controller allocation`)
	r = runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-json", "vol5")
	r.want(t, 0, "")
	var cv runtime.Volume
	if err := json.Unmarshal([]byte(r.stdout), &cv); err != nil || cv.ID != "vol5" || cv.CapacityBytes != 0 {
		t.Errorf("create -json = %+v, %v", cv, err)
	}
}

func TestVolumeDelete_Cases(t *testing.T) {
	b, env := populated(t)
	r := runCLI(t, env, "volume", "deregister", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "vol1" is in use: it has 1 claims`)
	r = runCLI(t, env, "volume", "delete", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "vol1" is in use: it has 1 claims`)
	// The old flag says what changed rather than deleting or failing
	// obscurely.
	r = runCLI(t, env, "volume", "delete", "-purge", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-purge was removed", "use 'csiactor volume deregister ID'")
	if _, err := b.Volume(context.Background(), "vol2"); err != nil {
		t.Fatalf("volume delete -purge changed something: %v", err)
	}
	runCLI(t, env, "volume", "delete", "vol2").want(t, 0, "Deleted volume vol2\n")
	evs, _ := b.Events(context.Background())
	if last := evs[len(evs)-1]; last.Type != runtime.EventVolumeDeleted || last.Volume != "vol2" {
		t.Errorf("last event %+v, want volume-deleted vol2", last)
	}
	runCLI(t, env, "volume", "release", "-alloc", "web-1", "vol1").want(t, 0, "Released the claim of web-1 on vol1 (state taken)\n")
	// Still a past claim: the fake keeps it, so deregistering conflicts.
	runCLI(t, env, "volume", "deregister", "vol1").want(t, 1, "")
	r = runCLI(t, env, "volume", "deregister", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "nope" not found`)
	r = runCLI(t, env, "volume", "delete", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "nope" not found`)

	if _, err := b.RegisterVolume(context.Background(), "vol3", runtime.VolumeSpec{Plugin: "hostpath", ExternalID: "ext-3",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}); err != nil {
		t.Fatal(err)
	}
	runCLI(t, env, "volume", "deregister", "vol3").want(t, 0, "Deregistered volume vol3\n")
	evs, _ = b.Events(context.Background())
	if last := evs[len(evs)-1]; last.Type != runtime.EventVolumeDeregistered || last.Volume != "vol3" {
		t.Errorf("last event %+v, want volume-deregistered vol3", last)
	}
}

func TestVolumeClaim_PrintsTargetPath(t *testing.T) {
	_, env := populated(t)
	args := []string{"volume", "claim", "-alloc", "web-2", "-mode", "write", "-access-mode", "multi-node-multi-writer", "-attachment-mode", "block-device", "vol2"}
	want := "/var/lib/csiactor/volumes/hostpath/per-alloc/web-2/vol2/rw-block-device-multi-node-multi-writer\n"
	runCLI(t, env, args...).want(t, 0, want)
	// The same claim again gives the same path.
	runCLI(t, env, args...).want(t, 0, want)
	r := runCLI(t, env, append(args, "-json")...)
	r.want(t, 0, "")
	var c runtime.Claim
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.TargetPath+"\n" != want || c.State != "published" {
		t.Errorf("claim -json = %+v, %v", c, err)
	}
}

func TestVolumeClaim_Errors(t *testing.T) {
	_, env := populated(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no alloc", []string{"-mode", "write", "-access-mode", "single-node-writer", "vol1"}, 2, "-alloc is required"},
		{"no mode", []string{"-alloc", "a", "-access-mode", "single-node-writer", "vol1"}, 2, "-mode is required"},
		{"no access mode", []string{"-alloc", "a", "-mode", "write", "vol1"}, 2, "-access-mode is required"},
		{"no volume", []string{"-alloc", "a", "-mode", "write", "-access-mode", "single-node-writer"}, 2, "missing VOLUME"},
		{"over the limit", []string{"-alloc", "web-2", "-mode", "write", "-access-mode", "single-node-writer", "vol1"}, 1, `volume "vol1": single-node-writer allows one claim in all`},
		{"bad mode", []string{"-alloc", "a", "-mode", "rw", "-access-mode", "single-node-writer", "vol1"}, 2, `csiactor volume claim: -mode: "rw": want read or write`},
		{"write on read-only", []string{"-alloc", "a", "-mode", "write", "-access-mode", "multi-node-reader-only", "vol1"}, 2, "-mode: write is not allowed with access mode multi-node-reader-only"},
		{"bad access mode", []string{"-alloc", "a", "-mode", "read", "-access-mode", "reader", "vol1"}, 2, `-access-mode: unknown access mode "reader"`},
		{"bad attachment mode", []string{"-alloc", "a", "-mode", "read", "-access-mode", "multi-node-reader-only", "-attachment-mode", "disk", "vol1"}, 2, `-attachment-mode: unknown attachment mode "disk"`},
		{"bad alloc", []string{"-alloc", "a b", "-mode", "read", "-access-mode", "multi-node-reader-only", "vol1"}, 2, `-alloc: "a b": use letters`},
		{"bad volume", []string{"-alloc", "a", "-mode", "read", "-access-mode", "multi-node-reader-only", "../x"}, 2, `VOLUME: "../x": use letters`},
		{"unknown volume", []string{"-alloc", "a", "-mode", "read", "-access-mode", "multi-node-reader-only", "nope"}, 1, `volume "nope" not found`},
		{"capability not offered", []string{"-alloc", "a", "-mode", "read", "-access-mode", "multi-node-reader-only", "vol1"}, 1, `volume "vol1" has no capability`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, env, append([]string{"volume", "claim"}, tc.args...)...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
		})
	}
}

func TestVolumeRelease_Cases(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "volume", "release", "-alloc", "web-1", "-json", "vol1")
	r.want(t, 0, "")
	var c runtime.Claim
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.State != runtime.ClaimTaken || c.Alloc != "web-1" {
		t.Errorf("release -json = %+v, %v", c, err)
	}
	runCLI(t, env, "volume", "status", "vol1").contains(t, "stdout", "Claims: none", "Past claims\n", "web-1  write  single-node-writer  file-system  taken")
	r = runCLI(t, env, "volume", "release", "-alloc", "web-9", "vol1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `alloc "web-9" holds no claim on volume "vol1"`)
	runCLI(t, env, "volume", "release", "vol1").want(t, 2, "")
}

// The usage and condition the plugin reported, in human sizes and
// percent.
func TestVolumeStatus_UsageAndCondition(t *testing.T) {
	b, env := populated(t)
	at := time.Date(2026, 11, 24, 22, 0, 1, 0, time.UTC)
	b.SetVolumeStats("vol1",
		&runtime.VolumeUsage{CapacityBytes: 1 << 30, AvailableBytes: 612 << 20, UsedBytes: 412 << 20, Inodes: 65536, InodesFree: 65524, InodesUsed: 12, CheckedAt: at},
		&runtime.VolumeCondition{Abnormal: true, Message: "DEGRADED OperatorFlagged: bad sectors", CheckedAt: at})
	r := runCLI(t, env, "volume", "status", "vol1")
	r.want(t, 0, "")
	r.contains(t, "stdout",
		"Capacity       -\n"+
			"Usage          412 MiB of 1 GiB used (40%), 612 MiB available\n"+
			"Inodes         12 of 65536 used (0%), 65524 free\n"+
			"Condition      abnormal: DEGRADED OperatorFlagged: bad sectors\n"+
			"Checked        2026-11-24T22:00:01Z\n"+
			"Capabilities   single-node-writer/file-system\n")
	b.SetVolumeStats("vol1", &runtime.VolumeUsage{CapacityBytes: 10 << 20, AvailableBytes: 10 << 20, CheckedAt: at},
		&runtime.VolumeCondition{CheckedAt: at})
	runCLI(t, env, "volume", "status", "vol1").contains(t, "stdout",
		"Usage          0 B of 10 MiB used (0%), 10 MiB available\n"+
			"Condition      normal\n")
	r = runCLI(t, env, "volume", "status", "-json", "vol1")
	r.contains(t, "stdout", `"usage": {`, `"available_bytes": 10485760`, `"condition": {`, `"checked_at": "2026-11-24T22:00:01Z"`)
}
