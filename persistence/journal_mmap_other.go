//go:build !linux

package persistence

import (
	"errors"
	"os"
)

// mmapJournal is false: journal files are not mapped on this system,
// every segment is plain.
const mmapJournal = false

var errNoPreallocate = errors.New("journal files are not mapped on this system")

func preallocate(*os.File, int64) error { return errNoPreallocate }

func mapFile(*os.File, int64) ([]byte, error) { return nil, errNoPreallocate }

func unmapFile([]byte) error { return nil }

func populate([]byte) {}
