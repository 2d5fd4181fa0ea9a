package claim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/persistence"
)

func TestApplyGroup_OnRootMismatch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to change a file's group")
	}
	root := t.TempDir()
	sub := filepath.Join(root, "d")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(sub, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gidOf := func(p string) (int, os.FileMode) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Sys().(*syscall.Stat_t).Gid), fi.Mode()
	}
	if err := ApplyGroup(root, 4321); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{root, sub, file} {
		g, m := gidOf(p)
		wantSetgid := p != file
		if g != 4321 || m&0o060 != 0o060 || (m&os.ModeSetgid != 0) != wantSetgid {
			t.Errorf("%s: group %d mode %s; want 4321, g+rw, setgid %t", p, g, m, wantSetgid)
		}
	}
	// The root matches now: a file given another group stays as it is.
	if err := os.Chown(file, -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := ApplyGroup(root, 4321); err != nil {
		t.Fatal(err)
	}
	if g, _ := gidOf(file); g != 0 {
		t.Errorf("the tree was walked although its root matched: file group %d", g)
	}
	// Another group: the root does not match, the whole tree changes.
	if err := ApplyGroup(root, 99); err != nil {
		t.Fatal(err)
	}
	if g, _ := gidOf(file); g != 99 {
		t.Errorf("file group %d after a root mismatch, want 99", g)
	}
}

func TestAdmit_Options(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	held := persistence.Claim{Alloc: "a", Mode: "write", AccessMode: mnmw.AccessMode.String(), AttachmentMode: mnmw.AttachmentMode.String(),
		State: StatePublished, MountGroup: "10", SELinuxContext: "u:r:t:s0", MountFlagCount: 1}
	v := vol(mnmw)
	v.Claims = []persistence.Claim{held}
	v.ClaimMountFlags = map[string]string{"a": "secret-flag"}
	base := Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw, Options: Options{MountGroup: "10", SELinuxContext: "u:r:t:s0", MountFlags: []string{"secret-flag"}}}
	for _, tt := range []struct {
		name   string
		change func(r *Request)
		index  int
		want   error
		says   string
	}{
		{"same options", func(*Request) {}, 0, nil, ""},
		{"read_only differs", func(r *Request) { r.Options.ReadOnly = true }, -1, ErrConflict, "read_only false, not true"},
		{"flags differ", func(r *Request) { r.Options.MountFlags = []string{"other"} }, -1, ErrConflict, "other mount_flags"},
		{"other alloc, same group and context", func(r *Request) { r.Alloc = "b"; r.Options.MountFlags = nil }, -1, nil, ""},
		{"other alloc, no group", func(r *Request) { r.Alloc = "b"; r.Options.MountGroup = "" }, -1, nil, ""},
		{"other alloc, other group", func(r *Request) { r.Alloc = "b"; r.Options.MountGroup = "20" }, -1, ErrConflict, "mount_group 10 (alloc \"a\"); the claim asks for mount_group 20"},
		{"other alloc, other context", func(r *Request) { r.Alloc = "b"; r.Options.SELinuxContext = "u:r:x:s0" }, -1, ErrConflict, `SELinux context "u:r:t:s0" (alloc "a"); the claim asks for "u:r:x:s0"`},
		{"other alloc, no context", func(r *Request) { r.Alloc = "b"; r.Options.SELinuxContext = "" }, -1, ErrConflict, "asks for none"},
		{"bad group", func(r *Request) { r.Alloc = "b"; r.Options.MountGroup = "x" }, -1, ErrInvalid, `mount_group "x"`},
		{"block with flags", func(r *Request) {
			r.Alloc = "b"
			r.Capability.AttachmentMode = csi.AttachmentModeBlockDevice
			r.Options = Options{MountFlags: []string{"f"}}
		}, -1, ErrInvalid, "mount_flags is only valid with attachment_mode file-system"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := base
			tt.change(&r)
			i, err := Admit(v, r)
			if i != tt.index || !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.says)) {
				t.Errorf("Admit = %d, %v; want %d, %v saying %q", i, err, tt.index, tt.want, tt.says)
			}
			if err != nil && strings.Contains(err.Error(), "secret-flag") {
				t.Errorf("the error shows a mount flag: %v", err)
			}
		})
	}
}

func TestStepFor_Options(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	r := Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw, Options: Options{ReadOnly: true, MountFlags: []string{"noexec"}, MountGroup: "7", SELinuxContext: "u:r:t:s0"}}
	Reserve(v, r, Facts{StageUnstage: true}, "/d", now)
	c := &v.Claims[0]
	pub, stage := stepFor(v, c, NodePublish), stepFor(v, c, NodeStage)
	if got := pub.Capability.MountOptions.MountFlags; !pub.Readonly || strings.Join(got, " ") != `ro noexec context="u:r:t:s0"` || pub.MountGroup != "7" {
		t.Errorf("NodePublish step: readonly %t flags %q group %q", pub.Readonly, got, pub.MountGroup)
	}
	if got := stage.Capability.MountOptions.MountFlags; strings.Join(got, " ") != `ro context="u:r:t:s0"` || stage.MountGroup != "7" {
		t.Errorf("NodeStage step: flags %q group %q", got, stage.MountGroup)
	}
	if got := v.MountOptions.MountFlags; len(got) != 1 {
		t.Errorf("the volume's own flags changed: %q", got)
	}
	// A second claim keeps the first's flags; a claim gone loses its own.
	Reserve(v, Request{Alloc: "b", Mode: ModeWrite, Capability: mnmw, Options: Options{MountFlags: []string{"x", "y"}}}, Facts{StageUnstage: true}, "/d", now)
	if got := optionsOf(v, &v.Claims[1]).MountFlags; strings.Join(got, " ") != "x y" || v.ClaimMountFlags["a"] != "noexec" {
		t.Errorf("flags after a second claim: %q, map %q", got, v.ClaimMountFlags)
	}
	v.Claims = v.Claims[1:]
	Reserve(v, Request{Alloc: "c", Mode: ModeWrite, Capability: mnmw}, Facts{StageUnstage: true}, "/d", now)
	if _, ok := v.ClaimMountFlags["a"]; ok || len(v.ClaimMountFlags) != 1 {
		t.Errorf("flags of claims gone are kept: %q", v.ClaimMountFlags)
	}
}
