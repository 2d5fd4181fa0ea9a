// Package persistence is csiactor's bbolt store: plugin allocations (with
// their creation sequence), volumes with their claims, past claims and
// staging usage, and the schema version.
//
// It is the only package that imports bbolt. Actor packages define the small
// interfaces they need from the store; [*Store] implements them.
//
// # Basics
//
// [Open] a file, use it from any number of goroutines, [Store.Close] it:
//
//	st, err := persistence.Open(filepath.Join(dataDir, "state.db"), persistence.Config{Registerer: reg, Logger: log})
//	if err != nil { ... }          // errors.Is(err, persistence.ErrInUse), ErrCorrupt, ErrSchemaTooNew
//	defer st.Close()
//	a, err := st.PutAllocation(ctx, persistence.Allocation{ID: "a1", Plugin: "hostpath", Type: "node"})
//	err = st.PutVolume(ctx, vol)
//	vols, err := st.ActiveVolumes(ctx) // at start-up: every volume with claims or past claims
//
// Records are kept one key per allocation or volume and written whole.
// Allocations are JSON. Volumes use a compact binary form (codec.go),
// four to six times faster to decode than JSON (BenchmarkDecodeVolume),
// so that an agent restarting with 100,000 claimed volumes loads them in
// well under a second; the
// store reads JSON volumes too and writes JSON if records.go ever has a
// field the codec does not know. Every write method blocks until its write
// is on disk, except [Store.PutVolumeDeferred], for the steps of a claim
// between its durable intent and its durable outcome: it returns once
// reads see the write, which the next checkpoint makes durable.
//
// With [Config.Keyring] set, the secrets of volumes and snapshots are
// sealed in every value the store writes, journal included, and opened on
// every read (sealing.go); [Store.Reseal] seals again what another key, or
// none, wrote.
//
// # Journal
//
// Volume writes (PutVolume, DeleteVolume), the ones a volume actor makes
// at a claim's intent and outcome, do not each cost a bbolt transaction:
// each is appended as one framed record (length, CRC-32C, op, ID, value)
// to a write-ahead journal next to the store file, "<file>.journal.<n>",
// with one pwrite(2), and returns once appended and fdatasync'd (unless
// [Config.NoSync]): one sync instead of bbolt's two. An in-memory overlay
// of the writes not yet in bbolt makes every read see every returned
// write, and the deferred ones ([Store.PutVolumeDeferred], never
// appended): [Store.Volume] looks there first; the scans
// ([Store.ForEachVolume], [Store.VolumeIDs], [Store.ActiveVolumes])
// checkpoint first. A checkpoint moves the overlay into bbolt in one
// transaction, in the background when the journal passes
// [Config.CheckpointBytes] or [Config.CheckpointDelay] after its first
// write, on scans, and on Close; it first rotates to a new journal
// generation and overlay, so writers never wait for bbolt. bbolt stays the
// store of record: Open replays whatever journal a crash left, in one
// transaction, and removes it. Allocations are written to bbolt directly.
//
// # Group commit
//
// Writes from all goroutines join one queue (volume writes the journal's,
// others bbolt's), committed by one committer goroutine per queue: every
// write queued (up to [Config.MaxBatchSize], gathered for at most
// [Config.MaxBatchDelay]) in one journal append or one bbolt transaction,
// with one fsync, and each caller handed its own result. The writes that
// queue while one batch is being synced form the next batch; a commit
// never waits for writes that have not arrived. A write that fails is
// taken out and the rest of its batch is committed without it.
//
// # Caveats
//
// The file is locked while open: a second Open of the same file, from this
// or another process, fails with [ErrInUse] after [Config.LockTimeout].
//
// A write that fails to append (a full disk) is taken back out of the
// journal file before it returns its error; if even that fails, the store
// refuses volume writes until its next checkpoint.
//
// Open never writes to a file it cannot fully read: an existing file is
// first checked through a read-only handle, and a damaged one is refused
// with [ErrCorrupt] and left exactly as it was; so is a damaged journal
// (only a write cut short at its very end, which had not returned, is
// dropped, with a log line). The journal files belong to the store file:
// copy, restore or move them aside together. A build older than the
// journal ignores it, so after a crash open the store once with this one
// before going back. bbolt reads pages through a
// memory map, where a truncated file would fault and a damaged page makes
// bbolt panic; the store turns both into ErrCorrupt errors instead of
// crashing. [Config.VerifyOnOpen] adds a full page check.
//
// [Config.NoSync] gives up durability for speed; never use it for a real
// agent. docs/operations.md ("Backups") says how to copy a store
// consistently and what the agent does with an old one.
package persistence
