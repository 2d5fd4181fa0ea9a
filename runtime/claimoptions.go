package runtime

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/csi"
)

// DefaultSELinuxFile exists on a host with SELinux (selinuxfs mounted).
const DefaultSELinuxFile = "/sys/fs/selinux/enforce"

// validateMountFlags checks mount flags given at field (a volume's or a
// claim's). It never echoes a flag: it may be a credential.
func validateMountFlags(field string, flags []string) error {
	for i, f := range flags {
		if f == "" || strings.ContainsRune(f, 0) {
			return fieldErr(fmt.Sprintf("%s[%d]", field, i), "must be non-empty and without NUL bytes")
		}
	}
	return nil
}

// validateOptions checks r's publish options for attachment mode at.
func (r ClaimRequest) validateOptions(at csi.AttachmentMode) error {
	if err := validateMountFlags("mount_flags", r.MountFlags); err != nil {
		return err
	}
	fsOnly := func(field string) error {
		return fieldErr(field, fmt.Sprintf("only valid with attachment_mode %s, not %s", csi.AttachmentModeFileSystem, at))
	}
	if len(r.MountFlags) > 0 && at != csi.AttachmentModeFileSystem {
		return fsOnly("mount_flags")
	}
	if g := r.MountGroup; g != nil {
		if *g < 0 || *g >= 1<<32-1 {
			return fieldErr("mount_group", fmt.Sprintf("%d is not a gid (0 to 4294967294)", *g))
		}
		if at != csi.AttachmentModeFileSystem {
			return fsOnly("mount_group")
		}
	}
	if c := r.SELinuxContext; c != "" {
		if err := claim.CheckSELinuxContext(c); err != nil {
			return fieldErr("selinux_context", fmt.Sprintf("%q is not an SELinux context (user:role:type[:level])", c))
		}
		if at != csi.AttachmentModeFileSystem {
			return fsOnly("selinux_context")
		}
	}
	return nil
}

// options returns r's publish options as the claim actors take them.
func (r ClaimRequest) options() claim.Options {
	o := claim.Options{ReadOnly: r.ReadOnly, MountFlags: r.MountFlags, SELinuxContext: r.SELinuxContext}
	if r.MountGroup != nil {
		o.MountGroup = strconv.FormatInt(*r.MountGroup, 10)
	}
	return o
}

// claimRequestPlain is ClaimRequest without its methods.
type claimRequestPlain ClaimRequest

// String prints r without its mount flags (only how many there are).
func (r ClaimRequest) String() string {
	b, _ := r.MarshalJSON()
	return string(b)
}

// GoString is String, so that %#v redacts too.
func (r ClaimRequest) GoString() string { return "runtime.ClaimRequest" + r.String() }

// MarshalJSON writes r with mount_flag_count in place of mount_flags.
// Decoding that output back into a ClaimRequest fails on the unknown
// field, so a redacted request is never sent by mistake.
func (r ClaimRequest) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		claimRequestPlain
		// Shadows the embedded field: never written.
		MountFlags     []string `json:"mount_flags,omitempty"`
		MountFlagCount int      `json:"mount_flag_count,omitempty"`
	}{claimRequestPlain: claimRequestPlain(r), MountFlagCount: len(r.MountFlags)})
}

// RequestJSON returns the full JSON body of r, mount flags included, for
// sending to the agent. Never log it.
func (r ClaimRequest) RequestJSON() ([]byte, error) { return json.Marshal(claimRequestPlain(r)) }

// setClaimOptions copies the options of the manager's claim c to out.
func setClaimOptions(out *Claim, c volume.Claim) {
	out.ReadOnly, out.MountFlagCount, out.SELinuxContext = c.ReadOnly, c.MountFlagCount, c.SELinuxContext
	if g, err := strconv.ParseInt(c.MountGroup, 10, 64); err == nil {
		out.MountGroup = &g
	}
}

// checkSELinux refuses an SELinux context on a host without SELinux.
func (r *Runtime) checkSELinux(req ClaimRequest) error {
	if req.SELinuxContext == "" || hasSELinux(r.cfg.Host) {
		return nil
	}
	return fieldErr("selinux_context", "this host has no SELinux (no selinuxfs), so a volume cannot be mounted with a context")
}

// hasSELinux reports whether the host has SELinux: h.SELinuxFile exists
// when set; otherwise DefaultSELinuxFile exists or the mount table shows
// a selinuxfs.
func hasSELinux(h HostConfig) bool {
	if h.SELinuxFile != "" {
		_, err := os.Stat(h.SELinuxFile)
		return err == nil
	}
	if _, err := os.Stat(DefaultSELinuxFile); err == nil {
		return true
	}
	table := h.MountTable
	if table == "" {
		table = "/proc/self/mountinfo"
	}
	f, err := os.Open(table)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: ... - fstype source options
		if _, after, ok := strings.Cut(sc.Text(), " - "); ok && strings.HasPrefix(after, "selinuxfs ") {
			return true
		}
	}
	return false
}
