package persistence

import "errors"

var (
	// ErrInUse is returned by Open when another process (usually a second
	// csiactor agent on the same data dir) holds the store file's lock and
	// does not release it within Config.LockTimeout.
	ErrInUse = errors.New("store file locked by another process")
	// ErrCorrupt is returned by Open when the store file is not a valid
	// csiactor store (garbage, truncated, damaged pages, missing buckets)
	// or its journal is damaged (anywhere but a write cut short at its
	// end), and by any method that meets a damaged page later. The file
	// and its journal files ("<file>.journal.<n>") are never rewritten,
	// truncated or repaired on this error: keep them for inspection and
	// restore a backup or move them aside, together.
	ErrCorrupt = errors.New("store file is corrupt")
	// ErrSchemaTooNew is returned by Open when the store file or its
	// journal was written by a newer csiactor with a schema or journal
	// format version this build does not know. Both are left untouched.
	ErrSchemaTooNew = errors.New("store schema is newer than this csiactor")
	// ErrClosed is returned by every method of a Store after Close.
	ErrClosed = errors.New("store closed")
	// ErrNotFound is returned when an allocation or volume with the given ID
	// is not stored.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is returned for a record or argument the store cannot keep
	// (an empty or oversized ID, for example); the message names the field.
	// Nothing is written.
	ErrInvalid = errors.New("invalid record")
	// ErrInvalidConfig is returned by Config.Validate and Open for a bad
	// Config; the message names the field.
	ErrInvalidConfig = errors.New("invalid config")
)
