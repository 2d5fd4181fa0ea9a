package persistence

import (
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/seal"
)

// Defaults used by DefaultConfig and for zero fields of a Config.
const (
	// DefaultLockTimeout is how long Open waits for another process to
	// release the store file.
	DefaultLockTimeout = time.Second
	// DefaultMaxBatchSize is the most writes committed in one
	// transaction.
	DefaultMaxBatchSize = 1024
	// DefaultMaxBatchDelay bounds how long a commit keeps gathering
	// queued writes into one transaction before it commits.
	DefaultMaxBatchDelay = 10 * time.Millisecond
	// DefaultCheckpointBytes is the journal size past which its writes are
	// checkpointed into the store file.
	DefaultCheckpointBytes = 4 << 20
	// DefaultCheckpointDelay is how long after the first write not yet
	// checkpointed the journal is checkpointed at the latest.
	DefaultCheckpointDelay = time.Second
)

// Config configures a Store. Zero fields mean their defaults.
type Config struct {
	// LockTimeout is how long Open waits for the file lock held by another
	// process before it fails with ErrInUse. Zero means DefaultLockTimeout.
	LockTimeout time.Duration
	// NoSync skips fsync on commit: a volume write is then one pwrite(2)
	// into the journal file (the page cache), which survives a crash of
	// the process but not of the machine. A power loss may lose or corrupt committed
	// writes: for benchmarks and tests only.
	NoSync bool
	// MaxBatchDelay bounds how long a commit keeps adding writes that are
	// already queued to the transaction it is building. It never waits
	// for writes that have not arrived: when the queue is empty it commits
	// at once. Zero means DefaultMaxBatchDelay.
	MaxBatchDelay time.Duration
	// MaxBatchSize is the most writes in one transaction or one journal
	// append (one fsync). Zero means DefaultMaxBatchSize; 1 turns group
	// commit off.
	MaxBatchSize int
	// CheckpointBytes is the journal size, in bytes, past which its
	// writes are moved into the store file in the background. Zero means
	// DefaultCheckpointBytes.
	CheckpointBytes int64
	// CheckpointDelay bounds how long a volume write stays in the journal
	// only: a checkpoint runs this long after the first write since the
	// last one. Zero means DefaultCheckpointDelay.
	CheckpointDelay time.Duration
	// VerifyOnOpen runs bbolt's full consistency check of every page when
	// an existing file is opened. It reads the whole file, so it costs
	// start-up time on large stores; off by default.
	VerifyOnOpen bool
	// Keyring, when set, seals every secret the store writes (the
	// Secrets of volumes and snapshots) and opens them on reads; the
	// records in memory hold them in clear. Nil writes them as they are.
	// Either way the store reads both forms, so a key can be set on a
	// store written without one (see Store.Reseal).
	Keyring *seal.Keyring
	// Registerer receives the store's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives open, migration and commit-failure messages; nil
	// discards them.
	Logger *logrus.Entry
}

// DefaultConfig returns the Config Open uses for zero fields.
func DefaultConfig() Config {
	return Config{
		LockTimeout:   DefaultLockTimeout,
		MaxBatchDelay: DefaultMaxBatchDelay,
		MaxBatchSize:  DefaultMaxBatchSize,

		CheckpointBytes: DefaultCheckpointBytes,
		CheckpointDelay: DefaultCheckpointDelay,
	}
}

// Validate reports the first field that cannot be used, wrapping
// ErrInvalidConfig. Zero values are valid (they mean the defaults).
func (c Config) Validate() error {
	switch {
	case c.LockTimeout < 0:
		return fmt.Errorf("lock_timeout %s is negative: %w", c.LockTimeout, ErrInvalidConfig)
	case c.MaxBatchDelay < 0:
		return fmt.Errorf("max_batch_delay %s is negative: %w", c.MaxBatchDelay, ErrInvalidConfig)
	case c.MaxBatchSize < 0:
		return fmt.Errorf("max_batch_size %d is negative: %w", c.MaxBatchSize, ErrInvalidConfig)
	case c.CheckpointBytes < 0:
		return fmt.Errorf("checkpoint_bytes %d is negative: %w", c.CheckpointBytes, ErrInvalidConfig)
	case c.CheckpointDelay < 0:
		return fmt.Errorf("checkpoint_delay %s is negative: %w", c.CheckpointDelay, ErrInvalidConfig)
	}
	return nil
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.LockTimeout == 0 {
		c.LockTimeout = d.LockTimeout
	}
	if c.MaxBatchDelay == 0 {
		c.MaxBatchDelay = d.MaxBatchDelay
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = d.MaxBatchSize
	}
	if c.CheckpointBytes == 0 {
		c.CheckpointBytes = d.CheckpointBytes
	}
	if c.CheckpointDelay == 0 {
		c.CheckpointDelay = d.CheckpointDelay
	}
	if c.Logger == nil {
		l := logrus.New()
		l.Out = io.Discard
		c.Logger = logrus.NewEntry(l)
	}
	return c
}
