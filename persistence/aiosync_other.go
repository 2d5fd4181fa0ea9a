//go:build !(linux && (amd64 || arm64))

package persistence

import (
	"errors"
	"os"
)

// aioSyncer is Linux-only (see aiosync_linux.go); elsewhere the journal
// syncs with fdatasync.
type aioSyncer struct{}

var errAIOUnsupported = errors.New("fdatasync through AIO is not supported here")

func newAIOSyncer() (*aioSyncer, error) { return nil, errAIOUnsupported }

func (*aioSyncer) sync(*os.File) error { return errAIOUnsupported }

func (*aioSyncer) close() error { return nil }
