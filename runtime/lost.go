package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkStoreNotLost refuses a data dir whose store file is missing or
// empty (a truncated file, a restore gone wrong, a file deleted by hand)
// while the directories an earlier agent made are still there: plugin
// directories (sockets, logs) and volume directories (stagings and target
// paths, maybe still mounted). A new store there would forget every
// allocation and claim and leave their mounts orphaned. A store file that
// has content is checked by persistence.Open, which refuses one it cannot
// read without writing to it.
func checkStoreNotLost(dataDir string) error {
	path := filepath.Join(dataDir, StoreFileName)
	state := "missing"
	switch fi, err := os.Stat(path); {
	case err == nil && fi.Size() > 0:
		return nil
	case err == nil:
		state = "empty (0 bytes)"
	case !errors.Is(err, fs.ErrNotExist):
		return nil // persistence.Open reports it
	}
	var found []string
	for _, d := range []string{"plugins", "volumes"} {
		dir := filepath.Join(dataDir, d)
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			found = append(found, dir)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return &kindError{kind: ErrStoreLost, err: fmt.Errorf(
		"store %s is %s, yet an earlier agent's directories are still there (%s): a new store would forget every allocation and claim and orphan their mounts; "+
			"restore %s from a backup, or, to start over, stop the plugins, unmount what is mounted under %s and move those directories aside",
		path, state, strings.Join(found, ", "), StoreFileName, filepath.Join(dataDir, "volumes"))}
}
