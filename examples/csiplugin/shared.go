package csiplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// joinShared opens cfg.SharedDir (creating it), loads the shared state
// and records this instance's node id in it, under the shared lock.
func (p *Plugin) joinShared() error {
	dir, err := filepath.Abs(p.cfg.SharedDir)
	if err != nil {
		return fmt.Errorf("%w: shared_dir: %w", ErrInvalidConfig, err)
	}
	p.cfg.SharedDir, p.dataDir = dir, dir
	if err := os.MkdirAll(filepath.Join(dir, volumesDir), 0o750); err != nil {
		return fmt.Errorf("create shared dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open shared lock: %w", err)
	}
	p.shared = f
	p.lockState()
	defer p.unlockState()
	if p.stale != nil {
		f.Close()
		return p.stale
	}
	if !slices.Contains(p.st.Nodes, p.cfg.NodeID) {
		p.st.Nodes = append(p.st.Nodes, p.cfg.NodeID)
		if err := p.st.save(dir); err != nil {
			f.Close()
			return err
		}
	}
	return nil
}

// lockState takes the state lock: p.mu, and with a shared dir the flock
// on its lock file, after which the state is read afresh (another
// instance may have changed it). When it cannot be read, p.stale says why
// and saveLocked refuses to write. Every RPC that touches the state holds
// the lock from its first read to its last write.
func (p *Plugin) lockState() {
	p.mu.Lock()
	if p.shared == nil {
		return
	}
	if err := flockRetry(p.shared, syscall.LOCK_EX); err != nil {
		p.stale = fmt.Errorf("lock %s: %w", p.shared.Name(), err)
		if p.st == nil {
			p.st = emptyState()
		}
		return
	}
	st, err := loadState(p.dataDir)
	if err != nil {
		p.stale = err
		if p.st == nil {
			p.st = emptyState()
		}
		return
	}
	p.st, p.stale = st, nil
}

// unlockState releases what lockState took.
func (p *Plugin) unlockState() {
	if p.shared != nil {
		_ = flockRetry(p.shared, syscall.LOCK_UN)
	}
	p.mu.Unlock()
}

// flockRetry is flock(2), retried when a signal interrupts it.
func flockRetry(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// knowsNodeLocked reports whether node is a node this plugin can publish
// to: its own, or with a shared dir any instance's that shares it.
func (p *Plugin) knowsNodeLocked(node string) bool {
	return node == p.cfg.NodeID || slices.Contains(p.st.Nodes, node)
}

// singleNode reports whether mode lets the volume be published to one node
// at a time.
func singleNode(mode csipb.VolumeCapability_AccessMode_Mode) bool {
	switch mode {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

// publishedElsewhereLocked returns FailedPrecondition when v is published
// to a node other than node and either publication is single-node, as the
// CSI spec asks of a volume without a MULTI_NODE capability.
func publishedElsewhereLocked(v *volume, node string, mode csipb.VolumeCapability_AccessMode_Mode) error {
	for other, pub := range v.Published {
		if other != node && (singleNode(mode) || singleNode(pub.AccessMode)) {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published to node %q with a single-node access mode", v.ID, other)
		}
	}
	return nil
}
