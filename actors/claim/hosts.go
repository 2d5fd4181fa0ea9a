package claim

import (
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// AdmitHosts decides whether r, asked for on host, may join held: the
// claims every host of a cluster holds on the volume, each with NodeID set
// to its host (this host's included). It applies the access-mode table of
// Admit across hosts: the single-node-* modes keep every claim on one
// host (and single-node-writer, single-node-single-writer and
// single-node-reader-only one claim in all); multi-node-single-writer
// allows one writer in the cluster. All claims must use the same access
// and attachment mode. The error wraps ErrConflict or ErrClaimLimit and
// names the holder and its host.
//
// Admit is checked first, on the host's own record; AdmitHosts adds what
// the other hosts hold.
func AdmitHosts(host string, r Request, held []persistence.Claim) error {
	var readers, writers int
	var holder, writer, elsewhere *persistence.Claim
	for i := range held {
		c := &held[i]
		if c.NodeID == host && c.Alloc == r.Alloc {
			continue
		}
		if c.AccessMode != r.Capability.AccessMode.String() || c.AttachmentMode != r.Capability.AttachmentMode.String() {
			return kinderr.Errorf(ErrConflict,
				"volume is claimed with %s/%s by alloc %q on host %q", c.AccessMode, c.AttachmentMode, c.Alloc, c.NodeID)
		}
		if c.Mode == string(ModeWrite) {
			writers++
			writer = c
		} else {
			readers++
		}
		holder = c
		if c.NodeID != host {
			elsewhere = c
		}
	}
	am := r.Capability.AccessMode
	switch am {
	case csi.AccessModeSingleNodeReaderOnly:
		if readers > 0 {
			return kinderr.Errorf(ErrClaimLimit, "access mode %s allows one reader and alloc %q on host %q holds it", am, holder.Alloc, holder.NodeID)
		}
	case csi.AccessModeSingleNodeWriter, csi.AccessModeSingleNodeSingleWriter:
		if readers+writers > 0 {
			return kinderr.Errorf(ErrClaimLimit, "access mode %s allows one claim and alloc %q on host %q holds it", am, holder.Alloc, holder.NodeID)
		}
	case csi.AccessModeSingleNodeMultiWriter:
		if elsewhere != nil {
			return kinderr.Errorf(ErrClaimLimit, "access mode %s keeps every claim on one host and alloc %q on host %q holds one", am, elsewhere.Alloc, elsewhere.NodeID)
		}
	case csi.AccessModeMultiNodeSingleWriter:
		if r.Mode == ModeWrite && writers > 0 {
			return kinderr.Errorf(ErrClaimLimit, "access mode %s allows one writer in the cluster and alloc %q on host %q holds it", am, writer.Alloc, writer.NodeID)
		}
	}
	return nil
}
