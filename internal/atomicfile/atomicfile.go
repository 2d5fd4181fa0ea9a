// Package atomicfile writes small state files so that a crash leaves
// either the old content or the new one, never a mix.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes b to path atomically: to a new file in the same directory,
// synced, then renamed over path. The rename itself is durable only once
// the directory is synced (SyncDir).
func Write(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}

// SyncDir syncs directory dir, making the renames in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
