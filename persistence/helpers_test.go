package persistence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	bolt "go.etcd.io/bbolt"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		holdStore(path)
		return
	}
	if spec := os.Getenv(crashEnv); spec != "" {
		crashWriter(spec)
		return
	}
	leakcheck.VerifyTestMain(m)
}

// checkLeaks fails t if goroutines started during the test outlive it. It
// runs after every later t.Cleanup, so stores closed by openT's cleanup
// are closed by then.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(leakcheck.Check(t))
}

// storePath returns a path for a store file inside a fresh temp dir.
func storePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "data", "state.db")
}

// openT opens path and closes the store when the test ends.
func openT(t testing.TB, path string, cfg Config) *Store {
	t.Helper()
	s, err := Open(path, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return b
}

// assertUnchanged fails if the file at path differs from want.
func assertUnchanged(t testing.TB, path string, want []byte) {
	t.Helper()
	if got := readFile(t, path); !bytes.Equal(got, want) {
		t.Fatalf("store file changed: %d bytes before, %d after (or same size, different bytes)", len(want), len(got))
	}
}

// volumeWithClaim returns a volume holding one published claim.
func volumeWithClaim(id string) Volume {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return Volume{
		ID:           id,
		Plugin:       "hostpath",
		ExternalID:   "ext-" + id,
		Capabilities: []Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		MountOptions: &MountOptions{FSType: "ext4"},
		Parameters:   map[string]string{"size": "1Gi"},
		Claims: []Claim{{
			Alloc: "alloc-1", Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system",
			State: "published", Usage: "rw-file-system-single-node-writer",
			TargetPath: "/var/lib/csiactor/volumes/hostpath/per-alloc/alloc-1/" + id + "/rw-file-system-single-node-writer",
			CreatedAt:  now, UpdatedAt: now,
		}},
		Stagings: []Staging{{Usage: "rw-file-system-single-node-writer", Path: "/staging/" + id, Users: []string{"alloc-1"}, Staged: true}},
		Revision: 3, CreatedAt: now, UpdatedAt: now,
	}
}

// testingProcs is GOMAXPROCS, for sizing parallel benchmarks.
func testingProcs() int { return runtime.GOMAXPROCS(0) }

// putRaw returns a write that stores an empty value under key in the
// volumes bucket (VolumeIDs lists keys without decoding them).
func putRaw(key string) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumes)).Put([]byte(key), []byte{})
	}
}

// blockCommitter queues a write that holds the committer inside its
// transaction until the returned function is called, so that writes sent
// meanwhile queue up and form one batch.
func (s *Store) blockCommitter(t *testing.T) (release func()) {
	t.Helper()
	entered := make(chan struct{})
	gate := make(chan struct{})
	go func() {
		_ = s.write(context.Background(), func(*bolt.Tx) error {
			select {
			case <-entered:
			default:
				close(entered)
			}
			<-gate
			return nil
		})
	}()
	<-entered
	return func() { close(gate) }
}

// blockJournal holds the journal's commit lock, as an append under way
// does, until the returned function is called, so that volume writes sent
// meanwhile queue up and form one group.
func (s *Store) blockJournal(t *testing.T) (release func()) {
	t.Helper()
	s.j.appends.lock()
	return s.j.appends.unlock
}

// lockedQueue is what tests use of either groupCommit.
type lockedQueue interface {
	lock()
	unlock()
	queued() int
}

// writeQueue is one of the store's two write queues, for tests that take
// the same steps on each.
type writeQueue struct {
	name  string
	queue func(s *Store) lockedQueue
	// block holds the queue's commit lock, as a commit under way does,
	// until release is called, so that writes sent meanwhile queue up.
	block func(s *Store, t *testing.T) (release func())
	// write writes a record under id through the queue; stored reports
	// whether the store holds one.
	write  func(ctx context.Context, s *Store, id string) error
	stored func(ctx context.Context, s *Store, id string) (bool, error)
}

var writeQueues = []writeQueue{
	{
		name:  "bbolt",
		queue: func(s *Store) lockedQueue { return &s.commits },
		block: (*Store).blockCommitter,
		write: func(ctx context.Context, s *Store, id string) error { return s.write(ctx, putRaw(id)) },
		stored: func(ctx context.Context, s *Store, id string) (bool, error) {
			ids, err := s.VolumeIDs(ctx)
			return slices.Contains(ids, id), err
		},
	},
	{
		name:  "journal",
		queue: func(s *Store) lockedQueue { return &s.j.appends },
		block: (*Store).blockJournal,
		write: func(ctx context.Context, s *Store, id string) error { return s.PutVolume(ctx, volumeWithClaim(id)) },
		stored: func(ctx context.Context, s *Store, id string) (bool, error) {
			_, err := s.Volume(ctx, id)
			if errors.Is(err, ErrNotFound) {
				return false, nil
			}
			return err == nil, err
		},
	},
}

// waitQueued waits until n writes are queued on q, behind a blocked
// commit.
func waitQueued(t *testing.T, q lockedQueue, n int) {
	t.Helper()
	for q.queued() < n {
		time.Sleep(time.Millisecond)
	}
}

// batchSizeText is the exposition text of
// csiactor_store_commit_batch_size after batches of sizes, one each.
func batchSizeText(sizes ...int) string {
	var b strings.Builder
	b.WriteString(`
# HELP csiactor_store_commit_batch_size Writes committed together in one store transaction or journal append.
# TYPE csiactor_store_commit_batch_size histogram
`)
	sum := 0
	for _, n := range sizes {
		sum += n
	}
	for le := 1; le <= 2048; le *= 2 {
		in := 0
		for _, n := range sizes {
			if n <= le {
				in++
			}
		}
		fmt.Fprintf(&b, "csiactor_store_commit_batch_size_bucket{le=\"%d\"} %d\n", le, in)
	}
	fmt.Fprintf(&b, "csiactor_store_commit_batch_size_bucket{le=\"+Inf\"} %d\n", len(sizes))
	fmt.Fprintf(&b, "csiactor_store_commit_batch_size_sum %d\n", sum)
	fmt.Fprintf(&b, "csiactor_store_commit_batch_size_count %d\n", len(sizes))
	return b.String()
}

// editBolt changes a closed store file with bbolt directly.
func editBolt(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// activeIDs returns the IDs ActiveVolumes lists.
func activeIDs(t *testing.T, s *Store) []string {
	t.Helper()
	vols, err := s.ActiveVolumes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, v := range vols {
		ids = append(ids, v.ID)
	}
	return ids
}

// noAutoCheckpoint is a Config whose journal is checkpointed only when a
// test (or a scan, or Close) asks.
var noAutoCheckpoint = Config{CheckpointBytes: 1 << 40, CheckpointDelay: time.Hour}

// crash closes s without checkpointing its journal, leaving the journal
// files as a killed process would.
func crash(t testing.TB, s *Store) {
	t.Helper()
	if err := s.close(false); err != nil {
		t.Fatalf("close without checkpoint: %v", err)
	}
}

// journalPaths returns the journal files of the store at path.
func journalPaths(t testing.TB, path string) []string {
	t.Helper()
	files, err := listJournals(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		out = append(out, f.path)
	}
	return out
}

// dirFiles returns the name and content of every file in dir.
func dirFiles(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		out[e.Name()] = readFile(t, filepath.Join(dir, e.Name()))
	}
	return out
}

// assertDirUnchanged fails if any file in dir was added, removed or
// changed since before was taken.
func assertDirUnchanged(t testing.TB, dir string, before map[string][]byte) {
	t.Helper()
	after := dirFiles(t, dir)
	for name, b := range before {
		a, ok := after[name]
		switch {
		case !ok:
			t.Errorf("%s was removed", name)
		case !bytes.Equal(a, b):
			t.Errorf("%s changed: %d bytes before, %d after", name, len(b), len(a))
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s was created", name)
		}
	}
}

// recordOffsets returns the offset of every record of a journal file, and
// where its records end last (its length, or where its preallocated zeros
// start).
func recordOffsets(t testing.TB, raw []byte) []int {
	t.Helper()
	var offs []int
	off := journalHeaderSize
	for off < len(raw) && !allZero(raw[off:]) {
		_, n, err := decodeJournalRecord(raw[off:])
		if err != nil {
			t.Fatalf("record at %d: %v", off, err)
		}
		offs = append(offs, off)
		off += n
	}
	return append(offs, off)
}

// volumeModel is what a test expects the store to hold.
type volumeModel struct {
	vols map[string]Volume
	ids  map[string]bool // every ID ever written or deleted
}

func newModel() *volumeModel { return &volumeModel{vols: map[string]Volume{}, ids: map[string]bool{}} }

func (m *volumeModel) put(t testing.TB, s *Store, v Volume) {
	t.Helper()
	if err := s.PutVolume(context.Background(), v); err != nil {
		t.Fatalf("PutVolume(%s): %v", v.ID, err)
	}
	m.vols[v.ID], m.ids[v.ID] = v, true
}

func (m *volumeModel) del(t testing.TB, s *Store, id string) {
	t.Helper()
	if err := s.DeleteVolume(context.Background(), id); err != nil {
		t.Fatalf("DeleteVolume(%s): %v", id, err)
	}
	delete(m.vols, id)
	m.ids[id] = true
}

// checkReads checks Volume for every ID the model knows.
func (m *volumeModel) checkReads(t testing.TB, s *Store) {
	t.Helper()
	ctx := context.Background()
	for id := range m.ids {
		got, err := s.Volume(ctx, id)
		want, ok := m.vols[id]
		switch {
		case !ok && !errors.Is(err, ErrNotFound):
			t.Errorf("Volume(%s) = %v, want ErrNotFound", id, err)
		case ok && err != nil:
			t.Errorf("Volume(%s): %v", id, err)
		case ok && !reflect.DeepEqual(got, want):
			t.Errorf("Volume(%s):\n got %+v\nwant %+v", id, got, want)
		}
	}
}

// checkScans checks VolumeIDs, ForEachVolume, ActiveVolumes and the
// volumes_with_work index in the file.
func (m *volumeModel) checkScans(t testing.TB, s *Store) {
	t.Helper()
	ctx := context.Background()
	var all, active []Volume
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range m.vols {
			if !yield(id) {
				return
			}
		}
	}) {
		v := m.vols[id]
		all = append(all, v)
		if v.Active() {
			active = append(active, v)
		}
	}
	ids, err := s.VolumeIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wantIDs []string
	for _, v := range all {
		wantIDs = append(wantIDs, v.ID)
	}
	if !slices.Equal(ids, wantIDs) {
		t.Errorf("VolumeIDs %v, want %v", ids, wantIDs)
	}
	var each []Volume
	if err := s.ForEachVolume(ctx, func(v Volume) error { each = append(each, v); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(each, all) {
		t.Errorf("ForEachVolume: %d volumes, want %d (or different records)", len(each), len(all))
	}
	got, err := s.ActiveVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, active) {
		t.Errorf("ActiveVolumes: %d volumes, want %d (or different records)", len(got), len(active))
	}
	var indexed, wantIndexed []string
	if err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketVolumesWithWork)).ForEach(func(k, _ []byte) error {
			indexed = append(indexed, string(k))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, v := range active {
		wantIndexed = append(wantIndexed, v.ID)
	}
	if !slices.Equal(indexed, wantIndexed) {
		t.Errorf("volumes_with_work index %v, want %v", indexed, wantIndexed)
	}
}

// check checks reads, then scans (which checkpoint first).
func (m *volumeModel) check(t testing.TB, s *Store) {
	t.Helper()
	m.checkReads(t, s)
	m.checkScans(t, s)
}

// hookedConfig returns noAutoCheckpoint logging to a test hook.
func hookedConfig() (Config, *test.Hook) {
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.DebugLevel)
	cfg := noAutoCheckpoint
	cfg.Logger = logrus.NewEntry(l)
	return cfg, hook
}

// logged reports whether hook caught a line of level containing part.
func logged(hook *test.Hook, level logrus.Level, part string) bool {
	for _, e := range hook.AllEntries() {
		if e.Level == level && strings.Contains(e.Message, part) {
			return true
		}
	}
	return false
}

func allZero(b []byte) bool { return !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) }

func truncate(t testing.TB, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// testJournal builds a journal file of generation 1 with groups of the
// given sizes, and returns it with the offset where each group starts (and
// the file's length last) and the records in order.
func testJournal(groups ...int) (raw []byte, starts []int, recs []journalRecord) {
	raw = appendJournalHeader(nil, 1)
	n := 0
	for g, size := range groups {
		starts = append(starts, len(raw))
		for i := range size {
			id := fmt.Sprintf("v%03d", n)
			op, flags, value := journalOpPut, byte(0), []byte("value of "+id)
			if n%4 == 3 {
				op, value = journalOpDelete, nil
			} else if n%2 == 0 {
				flags |= journalFlagActive
			}
			if i == size-1 {
				flags |= journalFlagEnd
			}
			raw = appendJournalRecord(raw, op, flags, uint64(g+1), id, value)
			recs = append(recs, journalRecord{op: op, flags: flags, group: uint64(g + 1), id: []byte(id), value: value})
			n++
		}
	}
	return raw, append(starts, len(raw)), recs
}

// sameRecords reports whether got equals want, field by field.
func sameRecords(got, want []journalRecord) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.op != w.op || g.flags != w.flags || g.group != w.group || !bytes.Equal(g.id, w.id) || !bytes.Equal(g.value, w.value) {
			return false
		}
	}
	return true
}

var testJournalFile = journalFile{path: "state.db.journal.1", gen: 1}

// rewriteRecord changes the body of the record at off with edit and fixes
// its CRC, so that only its content is wrong.
func rewriteRecord(raw []byte, off int, edit func(body []byte)) {
	n := binary.LittleEndian.Uint32(raw[off:])
	body := raw[off+journalFrameSize : off+journalFrameSize+int(n)]
	edit(body)
	binary.LittleEndian.PutUint32(raw[off+4:], crc32.Checksum(body, castagnoli))
}

// setDirectVolumes checkpoints the journal, so that no read finds an
// older write in the overlay, and then sends volume writes to bbolt
// directly (direct) or to the journal. No write may be in flight.
func (s *Store) setDirectVolumes(tb testing.TB, direct bool) {
	tb.Helper()
	if err := s.checkpoint(); err != nil {
		tb.Fatal(err)
	}
	s.directVolumes = direct
}

// seedVolumes puts volumes lo to hi-1, "vol-%06d" with one claim each, in
// one transaction (setup only).
func seedVolumes(b *testing.B, s *Store, lo, hi int) {
	b.Helper()
	err := s.update(func(tx *bolt.Tx) error {
		for i := lo; i < hi; i++ {
			v := volumeWithClaim(fmt.Sprintf("vol-%06d", i))
			data, err := s.encodeVolume(&v)
			if err != nil {
				return err
			}
			if err := tx.Bucket([]byte(bucketVolumes)).Put([]byte(v.ID), data); err != nil {
				return err
			}
			if err := tx.Bucket([]byte(bucketVolumesWithWork)).Put([]byte(v.ID), []byte{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// holdEnv makes the test binary a helper process that holds a store open
// (see holdStore), like a second agent on the same data dir.
const holdEnv = "CSIACTOR_TEST_HOLD_STORE"

// holdVolumesEnv, with holdEnv, makes the helper put that many volumes
// first, which stay in its journal (no checkpoint runs before Close).
const holdVolumesEnv = "CSIACTOR_TEST_HOLD_VOLUMES"

// holdStore opens path, puts the volumes holdVolumesEnv asks for, prints
// "ready", and closes it when stdin closes.
func holdStore(path string) {
	s, err := Open(path, Config{CheckpointBytes: 1 << 40, CheckpointDelay: time.Hour})
	if err != nil {
		fmt.Println("error:", err.Error())
		os.Exit(1)
	}
	n, _ := strconv.Atoi(os.Getenv(holdVolumesEnv))
	for i := range n {
		if err := s.PutVolume(context.Background(), volumeWithClaim(fmt.Sprintf("held-%d", i))); err != nil {
			fmt.Println("error:", err.Error())
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := s.Close(); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// holdInChild starts the test binary as a helper process that holds the
// store at path open (holdStore), with volumes volumes put in its journal,
// and waits until it has. release makes it close the store and exit, and
// waits for that.
func holdInChild(t *testing.T, path string, volumes int) (release func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+path, holdVolumesEnv+"="+strconv.Itoa(volumes), "GORACE=atexit_sleep_ms=0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("helper: %q, %v", line, err)
	}
	return func() {
		t.Helper()
		_ = stdin.Close()
		_, _ = io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper exit: %v", err)
		}
	}
}
