package claim

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// Options are a claim's own publish options. They are part of the claim's
// identity: the same allocation asking again with other options is a
// conflict, not the same claim.
type Options struct {
	// ReadOnly publishes the volume read-only (NodePublishVolume
	// readonly), whatever the claim's mode and access mode.
	ReadOnly bool
	// MountFlags are added to the volume's own for this claim's
	// NodePublishVolume. They may carry credentials: never log or show
	// them.
	MountFlags []string
	// MountGroup is a decimal gid, empty for none: passed to the node
	// plugin as volume_mount_group when it has VOLUME_MOUNT_GROUP, else
	// given by the agent to the published volume root (see ApplyGroup).
	MountGroup string
	// SELinuxContext is mounted as the context="..." flag when
	// staging and publishing; one per volume on a host.
	SELinuxContext string
}

// validate checks o for a claim with attachment mode at, naming the bad
// field and never a flag's text.
func (o Options) validate(at csi.AttachmentMode) error {
	fsOnly := func(field string) error {
		return kinderr.Errorf(ErrInvalid, "%s is only valid with attachment_mode %s, not %s", field, csi.AttachmentModeFileSystem, at)
	}
	for i, f := range o.MountFlags {
		if f == "" || strings.ContainsRune(f, 0) {
			return kinderr.Errorf(ErrInvalid, "mount_flags[%d] must be non-empty and without NUL bytes", i)
		}
	}
	if len(o.MountFlags) > 0 && at != csi.AttachmentModeFileSystem {
		return fsOnly("mount_flags")
	}
	if o.MountGroup != "" {
		if _, err := ParseGroup(o.MountGroup); err != nil {
			return err
		}
		if at != csi.AttachmentModeFileSystem {
			return fsOnly("mount_group")
		}
	}
	if o.SELinuxContext != "" {
		if err := CheckSELinuxContext(o.SELinuxContext); err != nil {
			return err
		}
		if at != csi.AttachmentModeFileSystem {
			return fsOnly("selinux_context")
		}
	}
	return nil
}

// ParseGroup parses a mount group: a decimal gid below 2^32-1 (the
// largest is the kernel's "no group").
func ParseGroup(s string) (int, error) {
	g, err := strconv.ParseUint(s, 10, 32)
	if err != nil || g == 1<<32-1 {
		return 0, kinderr.Errorf(ErrInvalid, "mount_group %q is not a gid (0 to 4294967294)", s)
	}
	return int(g), nil
}

// CheckSELinuxContext checks that s looks like an SELinux context,
// user:role:type[:level], with nothing that could break out of the quoted
// context="..." mount flag.
func CheckSELinuxContext(s string) error {
	parts := strings.SplitN(s, ":", 4)
	bad := len(s) > 255 || len(parts) < 3 || slices.Contains(parts[:min(3, len(parts))], "")
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.-:,", r)
		bad = bad || !ok
	}
	if bad {
		return kinderr.Errorf(ErrInvalid, "selinux_context %q is not an SELinux context (user:role:type[:level])", s)
	}
	return nil
}

// SELinuxMountFlag is the mount flag that mounts a volume with context,
// as kubelet's SELinuxMount does.
func SELinuxMountFlag(context string) string { return `context="` + context + `"` }

// optionsOf returns the options of c, a claim on v.
func optionsOf(v *persistence.Volume, c *persistence.Claim) Options {
	o := Options{ReadOnly: c.ReadOnly, MountGroup: c.MountGroup, SELinuxContext: c.SELinuxContext}
	if f, ok := v.ClaimMountFlags[c.Alloc]; ok && c.MountFlagCount > 0 {
		o.MountFlags = strings.Split(f, "\x00")
	}
	return o
}

// setOptions records o in c, a new claim on v (its mount flags on v). The
// volume's map is replaced, never changed in place, and keeps the flags of
// current claims only.
func setOptions(v *persistence.Volume, c *persistence.Claim, o Options) {
	c.ReadOnly = o.ReadOnly
	c.MountFlagCount = len(o.MountFlags)
	c.MountGroup = o.MountGroup
	c.SELinuxContext = o.SELinuxContext
	m := map[string]string{}
	for alloc, f := range v.ClaimMountFlags {
		if alloc != c.Alloc && FindClaim(v.Claims, alloc) >= 0 {
			m[alloc] = f
		}
	}
	if len(o.MountFlags) > 0 {
		m[c.Alloc] = strings.Join(o.MountFlags, "\x00")
	}
	v.ClaimMountFlags = m
	if len(m) == 0 {
		v.ClaimMountFlags = nil
	}
}

// differ names how o differs from the options of an existing claim, old;
// empty when they are the same. It never shows a mount flag.
func (o Options) differ(old Options) string {
	var d []string
	if o.ReadOnly != old.ReadOnly {
		d = append(d, fmt.Sprintf("read_only %t, not %t", old.ReadOnly, o.ReadOnly))
	}
	if !slices.Equal(o.MountFlags, old.MountFlags) {
		d = append(d, "other mount_flags")
	}
	if o.MountGroup != old.MountGroup {
		d = append(d, fmt.Sprintf("mount_group %s, not %s", orNone(old.MountGroup), orNone(o.MountGroup)))
	}
	if o.SELinuxContext != old.SELinuxContext {
		d = append(d, fmt.Sprintf("selinux_context %s, not %s", quotedOrNone(old.SELinuxContext), quotedOrNone(o.SELinuxContext)))
	}
	return strings.Join(d, ", ")
}

// admitOptions checks r's options against c, a claim that holds a place
// on v on this host: one mount group per staging (claims without one
// take what there is) and one SELinux context per volume (no context is
// one too: the volume is mounted without it).
func admitOptions(v *persistence.Volume, r Request, c *persistence.Claim) error {
	if g := r.Options.MountGroup; g != "" && c.MountGroup != "" && g != c.MountGroup {
		return kinderr.Errorf(ErrConflict,
			"volume %q is staged on this host with mount_group %s (alloc %q); the claim asks for mount_group %s",
			v.ID, c.MountGroup, c.Alloc, g)
	}
	if ctx := r.Options.SELinuxContext; ctx != c.SELinuxContext {
		return kinderr.Errorf(ErrConflict,
			"volume %q is mounted on this host with SELinux context %s (alloc %q); the claim asks for %s",
			v.ID, quotedOrNone(c.SELinuxContext), c.Alloc, quotedOrNone(ctx))
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func quotedOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return strconv.Quote(s)
}

// withFlags returns vc with flags added to its mount flags, sharing
// nothing with vc's.
func withFlags(vc csi.VolumeCapability, flags ...string) csi.VolumeCapability {
	if len(flags) == 0 || vc.AttachmentMode != csi.AttachmentModeFileSystem {
		return vc
	}
	mo := &csi.MountOptions{}
	if vc.MountOptions != nil {
		*mo = *vc.MountOptions
	}
	mo.MountFlags = append(slices.Clip(mo.MountFlags), flags...)
	vc.MountOptions = mo
	return vc
}

// withMountGroup returns vc with volume_mount_group gid, sharing nothing
// with vc's mount options.
func withMountGroup(vc csi.VolumeCapability, gid string) csi.VolumeCapability {
	if vc.AttachmentMode != csi.AttachmentModeFileSystem {
		return vc
	}
	mo := &csi.MountOptions{}
	if vc.MountOptions != nil {
		*mo = *vc.MountOptions
	}
	mo.VolumeMountGroup = gid
	vc.MountOptions = mo
	return vc
}

// applyClaimGroup gives s's published target its mount group, for a node
// plugin without VOLUME_MOUNT_GROUP. A read-only publish is left as it
// is, as kubelet does: nothing can be changed through it.
func applyClaimGroup(s Step) error {
	if s.Readonly || s.Capability.AttachmentMode != csi.AttachmentModeFileSystem {
		return nil
	}
	gid, err := ParseGroup(s.MountGroup)
	if err != nil {
		return err
	}
	return ApplyGroup(s.TargetPath, gid)
}

// ApplyGroup gives the volume published at root the group gid as kubelet's
// fsGroup does with fsGroupChangePolicy OnRootMismatch: when root already
// has the group, group read-write-execute and the setgid bit, nothing is
// changed; otherwise every file and directory of the tree gets the group
// and group read-write (directories also group execute and setgid, so
// that new files inherit the group). Symbolic links are given the group
// but not followed. Errors name the path, never a mount flag.
func ApplyGroup(root string, gid int) error {
	fi, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("mount_group: %w", err)
	}
	if groupMatches(fi, gid) {
		return nil
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, gid); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mask := fs.FileMode(0o060)
		if info.IsDir() {
			mask |= 0o010 | fs.ModeSetgid
		}
		return os.Chmod(p, info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)|mask)
	})
	if err != nil {
		return fmt.Errorf("mount_group %d: %w", gid, err)
	}
	return nil
}

// groupMatches reports whether the published root fi already has group
// gid, group rwx and setgid (kubelet's OnRootMismatch test).
func groupMatches(fi fs.FileInfo, gid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return int(st.Gid) == gid && fi.Mode()&0o070 == 0o070 && (!fi.IsDir() || fi.Mode()&fs.ModeSetgid != 0)
}
