package dockerplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/csiactor/csiactor/internal/atomicfile"
	"github.com/csiactor/csiactor/runtime"
)

// AllocPrefix starts the allocation ID of every claim a Mount makes.
const AllocPrefix = "docker-"

// AllocFor is the allocation that claims a volume for the engine's mount
// ID: "docker-<id>", or "docker-" and a hash of id where id is not a valid
// allocation ID.
func AllocFor(mountID string) string {
	a := AllocPrefix + mountID
	if runtime.ValidateID("alloc", a) == nil {
		return a
	}
	sum := sha256.Sum256([]byte(mountID))
	return AllocPrefix + hex.EncodeToString(sum[:16])
}

// mountKey is one mount ID of one volume.
type mountKey struct{ volume, id string }

// mountRef is what the book keeps of a mount ID.
type mountRef struct {
	// Driver is the driver the engine mounted the volume through.
	Driver string `json:"driver"`
	// Alloc is the allocation of the claim: AllocFor of the mount ID, or
	// of an earlier mount ID whose claim this one took over in its grace
	// period.
	Alloc string `json:"alloc"`
	// Refs is the number of Mounts without their Unmount; 0 while the
	// claim waits out the grace period before its release.
	Refs int `json:"refs"`
	// gen counts Mounts, so that the reconciler sees one between two
	// checks.
	gen uint64
}

// mountsFile is the book on disk.
type mountsFile struct {
	Version int          `json:"version"`
	Mounts  []mountEntry `json:"mounts"`
}

type mountEntry struct {
	Volume string `json:"volume"`
	ID     string `json:"id"`
	mountRef
}

// book counts the references of every mount ID and keeps the counts in
// a file, written whole and synced on every change.
type book struct {
	path string

	mu   sync.Mutex
	refs map[mountKey]*mountRef // guarded by mu
}

func openBook(path string) (*book, error) {
	b := &book{path: path, refs: map[mountKey]*mountRef{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read docker mounts: %w", err)
	}
	var f mountsFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("docker mounts %s is corrupt: %w", path, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("docker mounts %s: version %d, want 1", path, f.Version)
	}
	for _, e := range f.Mounts {
		if e.Volume == "" || e.ID == "" || e.Refs < 0 || runtime.ValidateID("alloc", e.Alloc) != nil {
			return nil, fmt.Errorf("docker mounts %s is corrupt: entry %q/%q with %d references", path, e.Volume, e.ID, e.Refs)
		}
		r := e.mountRef
		b.refs[mountKey{e.Volume, e.ID}] = &r
	}
	return b, nil
}

// add changes the references of k by delta and saves the book. It
// returns the new count; an Unmount of an unknown mount ID is no change
// (ok false).
func (b *book) add(k mountKey, driver string, delta int) (n int, ok bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.refs[k]
	isNew := r == nil
	if isNew {
		if delta < 0 {
			return 0, false, nil
		}
		r = &mountRef{Driver: driver, Alloc: AllocFor(k.id)}
		b.refs[k] = r
	}
	old := *r
	r.Refs = max(0, r.Refs+delta)
	if delta > 0 {
		r.gen++
	}
	if err := b.saveLocked(); err != nil {
		if isNew {
			delete(b.refs, k)
		} else {
			*r = old
		}
		return old.Refs, true, err
	}
	return r.Refs, true, nil
}

// takeOver moves the entry of from, with no reference left, to the new
// mount ID to, with one reference through driver: to's Mounts use from's
// claim. It returns to's entry.
func (b *book) takeOver(from, to mountKey, driver string) (mountRef, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.refs[from]
	if !ok || r.Refs != 0 {
		return mountRef{}, fmt.Errorf("docker mounts: %s of %s has references", from.id, from.volume)
	}
	if _, ok := b.refs[to]; ok {
		return mountRef{}, fmt.Errorf("docker mounts: %s of %s exists", to.id, to.volume)
	}
	moved := &mountRef{Driver: driver, Alloc: r.Alloc, Refs: 1, gen: r.gen + 1}
	delete(b.refs, from)
	b.refs[to] = moved
	if err := b.saveLocked(); err != nil {
		delete(b.refs, to)
		b.refs[from] = r
		return mountRef{}, err
	}
	return *moved, nil
}

// remove forgets k (its claim is released) and saves the book.
func (b *book) remove(k mountKey) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.refs[k]
	if !ok {
		return nil
	}
	delete(b.refs, k)
	if err := b.saveLocked(); err != nil {
		b.refs[k] = r
		return err
	}
	return nil
}

// get returns a copy of k's entry.
func (b *book) get(k mountKey) (mountRef, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.refs[k]
	if !ok {
		return mountRef{}, false
	}
	return *r, true
}

// entries returns a copy of every entry, by volume and ID; with volume
// set, of that volume only.
func (b *book) entries(volume string) []mountEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]mountEntry, 0, len(b.refs))
	for k, r := range b.refs {
		if volume == "" || k.volume == volume {
			out = append(out, mountEntry{Volume: k.volume, ID: k.id, mountRef: *r})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Volume != out[j].Volume {
			return out[i].Volume < out[j].Volume
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// saveLocked writes the book to a new file, syncs it and renames it over
// the old one, then syncs the directory.
func (b *book) saveLocked() error {
	f := mountsFile{Version: 1, Mounts: make([]mountEntry, 0, len(b.refs))}
	for k, r := range b.refs {
		f.Mounts = append(f.Mounts, mountEntry{Volume: k.volume, ID: k.id, mountRef: *r})
	}
	sort.Slice(f.Mounts, func(i, j int) bool {
		if f.Mounts[i].Volume != f.Mounts[j].Volume {
			return f.Mounts[i].Volume < f.Mounts[j].Volume
		}
		return f.Mounts[i].ID < f.Mounts[j].ID
	})
	data, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode docker mounts: %w", err)
	}
	if err := writeFileSync(b.path, data); err != nil {
		return fmt.Errorf("save docker mounts: %w", err)
	}
	return nil
}

// writeFileSync writes data to path atomically and durably: the directory
// is made if missing, and synced after the rename.
func writeFileSync(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(path, data); err != nil {
		return err
	}
	return atomicfile.SyncDir(dir)
}
