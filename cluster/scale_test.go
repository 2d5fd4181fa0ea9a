package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/runtime"
)

// Environment variables of BenchmarkScale, with their defaults (small, so
// that `make bench` stays short; see BenchmarkScale for the campaign).
const (
	scaleAgentsEnv  = "CSIACTOR_SCALE_AGENTS"  // comma-separated agent counts, one sub-benchmark each
	scaleVolumesEnv = "CSIACTOR_SCALE_VOLUMES" // volumes registered
	scaleClaimsEnv  = "CSIACTOR_SCALE_CLAIMS"  // claims timed
)

const (
	defaultScaleAgents  = "3"
	defaultScaleVolumes = 1000
	defaultScaleClaims  = 200
	// scaleRegisterWorkers is how many volume registrations (or etcd
	// transactions of them) are in flight at once.
	scaleRegisterWorkers = 16
	// scaleRegisterMore is how many volumes are registered through the
	// agents once they run, for the cost of a registration.
	scaleRegisterMore = 200
	// scaleIdle is the window in which the cluster's background traffic
	// (lease renewals, liveness keys, host lists) is measured, to be
	// subtracted from the claims' traffic.
	scaleIdle = 5 * time.Second
	// scaleWait bounds the benchmark's waits (every volume on every agent,
	// a restarted agent ready); a safety net, not a measurement.
	scaleWait = 10 * time.Minute
)

// BenchmarkScale simulates a fleet: for each agent count N of
// CSIACTOR_SCALE_AGENTS (default 3), N agents in this process (each a
// runtime.Runtime in cluster mode with its own data dir on tmpfs, store,
// etcd session and watches, and a fake plugin as a monolith allocation) on
// a fresh 3-member embedded etcd holding CSIACTOR_SCALE_VOLUMES volume
// definitions (default 1,000: the first registered through the first
// agent, the others written straight to etcd as copies of it before the
// other agents start). Then CSIACTOR_SCALE_CLAIMS claims (default 200)
// one at a time, each by a random agent on a volume not claimed before,
// released and freed on the agent before the next. It reports, per N:
//
//   - claim-p50-ms, claim-p99-ms: the runtime's Claim of a
//     single-node-writer volume, the definition read from etcd (the agent
//     never saw the volume), admission in etcd and publish through the
//     fake plugin (no mount);
//   - etcd-reqs/claim, etcd-rx-B/claim, etcd-tx-B/claim, peer-B/claim:
//     requests the etcd members received from clients (gRPC messages:
//     unary calls and messages on streams), client bytes received and
//     sent, and bytes between the members, per claim with its release and
//     its removal from etcd, less the background measured while idle;
//   - bg-reqs/s, bg-rx-B/s, bg-tx-B/s: that background, the whole cluster
//     idle (lease renewals, liveness keys, host lists);
//   - events/volume-put, events/claim: watch events the members sent to
//     the agents per volume registered through the agents (200 of them,
//     once they run), and per claim;
//   - register-ms/volume: those 200 registrations, 16 at a time, per
//     volume; seed-s: the time to write the others straight to etcd;
//     start-s/agent: the agents started one after the other;
//   - heap-MiB/agent: the live heap (after GC) of one more agent that
//     joins the fleet in a process of its own (the test binary again, on
//     a data dir of its own), once ready, less the process's before it
//     started the agent (with CSIACTOR_SCALE_HEAPPROFILE=FILE that
//     process writes its heap profile there); heap-full-cache-MiB/agent:
//     the same once it has read cluster.volume_cache volumes (its default),
//     which it keeps;
//   - fleet-heap-MiB/agent: live heap with the agents running, less the
//     same after they are stopped (the etcd members, fake plugins and the
//     benchmark stay), over N: an average that also counts what the etcd
//     members hold for the agents, and moves with the members' own heap;
//   - db-MiB, db-inuse-MiB: the etcd database of a member, file and in use;
//   - restart-ready-s: one agent stopped, then started again on its data
//     dir, until runtime.Ready reports ready (it reads from etcd only the
//     definitions it keeps: restart-kept-volumes); restart-synced-s: until
//     it also serves a volume registered on another agent once it was
//     ready.
//
// The etcd counters are the process-wide ones of the embedded members
// (grpc_server_msg_received_total, etcd_network_client_grpc_*_bytes_total,
// etcd_network_peer_sent_bytes_total, etcd_debugging_mvcc_events_total),
// summed over the three. It runs once per N whatever -benchtime says
// (`make bench` gives it 1x). The campaign of docs/operations.md's sizing
// section:
//
//	CSIACTOR_SCALE_AGENTS=10,100,300 CSIACTOR_SCALE_VOLUMES=100000 CSIACTOR_SCALE_CLAIMS=10000 \
//	  go test -run '^$' -bench '^BenchmarkScale$' -benchtime 1x -timeout 3h ./cluster/
func BenchmarkScale(b *testing.B) {
	agents := scaleEnvInts(b, scaleAgentsEnv, defaultScaleAgents)
	volumes := scaleEnvInts(b, scaleVolumesEnv, strconv.Itoa(defaultScaleVolumes))[0]
	claims := scaleEnvInts(b, scaleClaimsEnv, strconv.Itoa(defaultScaleClaims))[0]
	if claims > volumes {
		b.Fatalf("%s=%d is more than %s=%d: every claim takes a volume of its own", scaleClaimsEnv, claims, scaleVolumesEnv, volumes)
	}
	for _, n := range agents {
		b.Run(fmt.Sprintf("agents=%d/volumes=%d", n, volumes), func(b *testing.B) {
			r := runScale(b, n, volumes, claims)
			for _, m := range r.metrics() {
				b.ReportMetric(m.v, m.unit)
			}
			fmt.Println(r.String())
		})
	}
}

// scaleEnvInts parses the comma-separated positive integers of env, def
// when unset.
func scaleEnvInts(b *testing.B, env, def string) []int {
	b.Helper()
	s := os.Getenv(env)
	if s == "" {
		s = def
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want positive integers separated by commas", env, s)
		}
		out = append(out, n)
	}
	return out
}

// scaleResult is what runScale measured.
type scaleResult struct {
	agents, volumes, claims int
	p50, p99                time.Duration
	reqs, rxB, txB, peerB   float64 // per claim, background subtracted
	bgReqs, bgRxB, bgTxB    float64 // per second
	eventsPerPut            float64
	eventsPerClaim          float64
	heapPerAgent            float64 // bytes, of the agent that joins last
	fleetHeapPerAgent       float64 // bytes, the fleet's average
	dbSize, dbInUse         int64
	heapFullCache           float64 // bytes, the same agent once it read DefaultVolumeCache volumes
	restart                 time.Duration
	restartSynced           time.Duration
	restartKept             float64       // volume definitions the restarted agent keeps
	register                time.Duration // per volume registered through the agents, once they run
	seed                    time.Duration // the volumes written straight to etcd
	startAgents             time.Duration // the agents but the first started, one after the other
}

type scaleMetric struct {
	v    float64
	unit string
}

func (r scaleResult) metrics() []scaleMetric {
	const mib = 1 << 20
	return []scaleMetric{
		{float64(r.p50.Microseconds()) / 1000, "claim-p50-ms"},
		{float64(r.p99.Microseconds()) / 1000, "claim-p99-ms"},
		{r.reqs, "etcd-reqs/claim"},
		{r.rxB, "etcd-rx-B/claim"},
		{r.txB, "etcd-tx-B/claim"},
		{r.peerB, "peer-B/claim"},
		{r.bgReqs, "bg-reqs/s"},
		{r.bgRxB, "bg-rx-B/s"},
		{r.bgTxB, "bg-tx-B/s"},
		{r.eventsPerPut, "events/volume-put"},
		{r.eventsPerClaim, "events/claim"},
		{r.heapPerAgent / mib, "heap-MiB/agent"},
		{r.heapFullCache / mib, "heap-full-cache-MiB/agent"},
		{r.fleetHeapPerAgent / mib, "fleet-heap-MiB/agent"},
		{float64(r.dbSize) / mib, "db-MiB"},
		{float64(r.dbInUse) / mib, "db-inuse-MiB"},
		{r.restart.Seconds(), "restart-ready-s"},
		{r.restartSynced.Seconds(), "restart-synced-s"},
		{r.restartKept, "restart-kept-volumes"},
		{float64(r.register.Microseconds()) / 1000, "register-ms/volume"},
		{r.seed.Seconds(), "seed-s"},
		{r.startAgents.Seconds() / float64(max(r.agents-1, 1)), "start-s/agent"},
	}
}

// String is one line of the table the benchmark prints.
func (r scaleResult) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "scale agents=%d volumes=%d claims=%d:", r.agents, r.volumes, r.claims)
	for _, m := range r.metrics() {
		fmt.Fprintf(&sb, " %s=%.4g", m.unit, m.v)
	}
	return sb.String()
}

// etcdCounters are the embedded members' counters BenchmarkScale reads,
// summed over the members (they share the process's default registry).
type etcdCounters struct {
	reqs, rxB, txB, peerB, events float64
	at                            time.Time
}

func readEtcdCounters(b *testing.B) etcdCounters {
	g := prometheus.DefaultGatherer
	return etcdCounters{
		reqs:   metrictest.Sum(b, g, "grpc_server_msg_received_total", nil),
		rxB:    metrictest.Sum(b, g, "etcd_network_client_grpc_received_bytes_total", nil),
		txB:    metrictest.Sum(b, g, "etcd_network_client_grpc_sent_bytes_total", nil),
		peerB:  metrictest.Sum(b, g, "etcd_network_peer_sent_bytes_total", nil),
		events: metrictest.Sum(b, g, "etcd_debugging_mvcc_events_total", nil),
		at:     time.Now(),
	}
}

func (c etcdCounters) sub(o etcdCounters) etcdCounters {
	return etcdCounters{reqs: c.reqs - o.reqs, rxB: c.rxB - o.rxB, txB: c.txB - o.txB,
		peerB: c.peerB - o.peerB, events: c.events - o.events}
}

// scaleJoinEnv, set, makes the test binary scaleJoinChild: one agent
// that joins the cluster of the etcd endpoints it holds (separated by
// commas), for BenchmarkScale's heap per agent.
const scaleJoinEnv = "CSIACTOR_SCALE_JOIN"

// scaleJoinReadEnv is how many volumes (scaleVolumeID 0 on) scaleJoinChild
// reads once ready.
const scaleJoinReadEnv = "CSIACTOR_SCALE_JOIN_READ"

// scaleJoinHeap runs scaleJoinChild in a process of its own on endpoints
// and returns the heaps it reports: once ready, and once it has read
// volumes read.
func scaleJoinHeap(b *testing.B, endpoints []string, read int) (ready, full float64) {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), scaleJoinEnv+"="+strings.Join(endpoints, ","), scaleJoinReadEnv+"="+strconv.Itoa(read))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("the joining agent's process: %v: %s", err, stderr.Bytes())
	}
	if _, err := fmt.Sscanf(string(out), "heap=%g full=%g", &ready, &full); err != nil {
		b.Fatalf("the joining agent's process printed %q: %v", out, err)
	}
	return ready, full
}

// scaleJoinChild starts an agent on a new data dir (tmpfs where there is
// one) in cluster mode on the endpoints of scaleJoinEnv, waits until it
// is ready, and prints the live heap it added: heap=BYTES. It is the
// whole process, so nothing else moves the figure.
func scaleJoinChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	root := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		root = "/dev/shm"
	}
	dir, err := os.MkdirTemp(root, "csiactor-join-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	keyFile := filepath.Join(dir, "secrets.key")
	if err := os.WriteFile(keyFile, bytes.Repeat([]byte{42}, 32), 0o600); err != nil {
		return fail(err)
	}
	cfg := runtime.Config{
		Secrets: &runtime.SecretsConfig{KeyFile: keyFile},
		DataDir: filepath.Join(dir, "data"),
		API:     runtime.APIConfig{HTTPAddr: "127.0.0.1:0"},
		Store:   runtime.StoreConfig{NoSync: true},
		Host:    runtime.HostConfig{SkipMountCheck: true},
		Cluster: &runtime.ClusterConfig{
			NodeID: "join",
			Etcd:   runtime.EtcdConfig{Endpoints: strings.Split(os.Getenv(scaleJoinEnv), ","), DialTimeout: 5 * time.Second},
		},
	}
	base := liveHeap()
	rt, err := runtime.New(cfg, runtime.Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	if err := rt.Start(ctx); err != nil {
		return fail(err)
	}
	defer func() { _ = rt.Shutdown(ctx) }()
	deadline := time.Now().Add(scaleWait)
	for {
		r, err := rt.Ready(ctx)
		if err != nil {
			return fail(err)
		}
		if r.Status == runtime.ReadyOK {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("not ready after %s: %v", scaleWait, r.Pending))
		}
		time.Sleep(5 * time.Millisecond)
	}
	ready := liveHeap() - base
	read, _ := strconv.Atoi(os.Getenv(scaleJoinReadEnv))
	for i := range read {
		if _, err := rt.Volume(ctx, scaleVolumeID(i)); err != nil {
			return fail(err)
		}
	}
	fmt.Printf("heap=%d full=%d\n", ready, liveHeap()-base)
	if p := os.Getenv("CSIACTOR_SCALE_HEAPPROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := pprof.WriteHeapProfile(f); err != nil {
			return fail(err)
		}
	}
	return 0
}

// liveHeap is the live heap after a full collection.
func liveHeap() uint64 {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func runScale(b *testing.B, n, volumes, claims int) scaleResult {
	b.StopTimer()
	res := scaleResult{agents: n, volumes: volumes, claims: claims}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	members := etcdtest.StartCluster(b, 3)
	const am = "single-node-writer"
	ids := make([]string, volumes)
	for i := range ids {
		ids[i] = scaleVolumeID(i)
	}

	// The agents, each with the production lease TTL (its renewals are
	// the background traffic) and plugin heartbeat (the tests' 500 ms
	// would have the process probe 2N fake plugins a second, a load no
	// host of a real fleet carries for the others).
	as := make([]*agent, n)
	startAgent := func(i int) {
		node := fmt.Sprintf("s%03d", i)
		cfg := benchConfig(b, node, members[0].Endpoint())
		cfg.Cluster.Etcd.Endpoints = etcdtest.Endpoints(members)
		cfg.Cluster.LeaseTTL = 0
		cfg.Cluster.Etcd.DialTimeout = 0 // the production default
		cfg.Plugins.HeartbeatInterval = runtime.DefaultHeartbeatInterval
		as[i] = startAgentWith(b, node, cfg)
	}

	// The cluster's volumes: the first registered through the first
	// agent, the others written straight to etcd as that definition with
	// their own ID (bulk registration is not what this measures), before
	// the other agents join.
	startAgent(0)
	if _, err := as[0].rt.RegisterVolume(ctx, ids[0], volSpec(ids[0], am)); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	seedVolumes(b, etcdtest.Endpoints(members), ids)
	res.seed = time.Since(start)
	start = time.Now()
	for i := 1; i < n; i++ {
		startAgent(i)
	}
	res.startAgents = time.Since(start)
	// Every volume listed by the last agent (a page read may time out
	// while the machine is busy with many agents: tried again).
	waitFor(b, "every volume listed on the last agent", scaleWait, time.Second, func() (bool, error) {
		vs, err := as[n-1].rt.Volumes(ctx, runtime.VolumeFilter{})
		if err != nil {
			b.Logf("listing on the last agent: %v", err)
			return false, nil
		}
		if len(vs) != volumes {
			return false, fmt.Errorf("the last agent lists %d volumes, want %d", len(vs), volumes)
		}
		return true, nil
	})

	// More volumes registered through the agents in turn: what each
	// registration costs, and the watch events it sends.
	before := readEtcdCounters(b)
	start = time.Now()
	more := make([]string, scaleRegisterMore)
	for i := range more {
		more[i] = fmt.Sprintf("more-%05d", i)
	}
	scaleParallel(b, len(more), func(i int) error {
		a := as[i%n]
		if _, err := a.rt.RegisterVolume(ctx, more[i], volSpec(more[i], am)); err != nil {
			return fmt.Errorf("register %s on %s: %w", more[i], a.node, err)
		}
		return nil
	})
	res.register = time.Since(start) / time.Duration(len(more))
	res.eventsPerPut = readEtcdCounters(b).sub(before).events / float64(len(more))

	// The background, idle.
	idle := readEtcdCounters(b)
	time.Sleep(scaleIdle)
	bg := readEtcdCounters(b)
	idleSecs := bg.at.Sub(idle.at).Seconds()
	bg = bg.sub(idle)
	res.bgReqs, res.bgRxB, res.bgTxB = bg.reqs/idleSecs, bg.rxB/idleSecs, bg.txB/idleSecs

	// The claims, one at a time.
	events := make([]<-chan runtime.Event, n)
	for i, a := range as {
		ch, err := a.rt.Subscribe(ctx)
		if err != nil {
			b.Fatal(err)
		}
		events[i] = ch
	}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	order := rng.Perm(volumes)[:claims]
	took := make([]time.Duration, claims)
	before = readEtcdCounters(b)
	b.StartTimer()
	for k, vi := range order {
		ai := rng.IntN(n)
		a, vol, alloc := as[ai], ids[vi], fmt.Sprintf("c%d", k)
		t0 := time.Now()
		if _, err := a.rt.Claim(ctx, vol, claimReq(alloc, "write", am)); err != nil {
			b.Fatalf("claim %s on %s: %s", vol, a.node, err)
		}
		took[k] = time.Since(t0)
		if _, err := a.rt.Release(ctx, vol, alloc); err != nil {
			b.Fatalf("release %s on %s: %s", vol, a.node, err)
		}
		for e := range events[ai] {
			if e.Type == runtime.EventClaimFreed && e.Alloc == alloc {
				break
			}
		}
	}
	b.StopTimer()
	waitFor(b, "every claim removed from etcd", scaleWait, 100*time.Millisecond, func() (bool, error) {
		ns, err := as[0].rt.Nodes(ctx)
		for _, nd := range ns {
			if nd.Claims > 0 {
				return false, err
			}
		}
		return err == nil, err
	})
	after := readEtcdCounters(b)
	secs := after.at.Sub(before.at).Seconds()
	d := after.sub(before)
	perClaim := func(total, bgRate float64) float64 { return (total - bgRate*secs) / float64(claims) }
	res.reqs = perClaim(d.reqs, res.bgReqs)
	res.rxB = perClaim(d.rxB, res.bgRxB)
	res.txB = perClaim(d.txB, res.bgTxB)
	res.peerB = perClaim(d.peerB, bg.peerB/idleSecs)
	res.eventsPerClaim = perClaim(d.events, bg.events/idleSecs)
	slices.Sort(took)
	res.p50 = took[claims*50/100]
	res.p99 = took[min(claims-1, claims*99/100)]
	cancel()
	ctx = context.Background()

	res.dbSize, res.dbInUse = members[0].DBSize()
	withAgents := liveHeap()

	// A restart: one agent stopped, then started on its data dir until
	// ready. Its fake plugin goes on serving, as a plugin process outlives
	// a restart of the agent. It keeps the volumes it claimed (up to
	// cluster.volume_cache), and reads only those from etcd.
	ai := rng.IntN(n)
	a := as[ai]
	a.stop()
	t0 := time.Now()
	a.start()
	waitFor(b, a.node+" ready after its restart", scaleWait, 5*time.Millisecond, func() (bool, error) {
		r, err := a.rt.Ready(ctx)
		return r.Status == runtime.ReadyOK, err
	})
	res.restart = time.Since(t0)
	res.restartKept, _ = metrictest.Value(b, a.reg, "csiactor_cluster_volumes_kept", nil)
	last := "zz-after-restart"
	if _, err := as[(ai+1)%n].rt.RegisterVolume(ctx, last, volSpec(last, am)); err != nil {
		b.Fatal(err)
	}
	waitFor(b, last+" on "+a.node+" after its restart", scaleWait, 5*time.Millisecond, func() (bool, error) {
		_, err := a.rt.Volume(ctx, last)
		if errors.Is(err, runtime.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	})
	res.restartSynced = time.Since(t0)

	// One more agent joins, in a process of its own: its live heap once
	// ready, less the same process's before it started the agent; then
	// once it has read as many volumes as its cache keeps.
	res.heapPerAgent, res.heapFullCache = scaleJoinHeap(b, etcdtest.Endpoints(members), min(volumes, runtime.DefaultVolumeCache))

	for _, a := range as {
		a.stop()
	}
	withoutAgents := liveHeap()
	res.fleetHeapPerAgent = (float64(withAgents) - float64(withoutAgents)) / float64(n)
	return res
}

// scaleVolumeID is the ID of BenchmarkScale's volume i.
func scaleVolumeID(i int) string { return fmt.Sprintf("vol-%06d", i) }

// scaleSeedTxn is how many definitions seedVolumes writes per etcd
// transaction (etcd's default limit is 128 operations).
const scaleSeedTxn = 128

// seedVolumes writes the definitions of ids[1:] to etcd as copies of
// ids[0]'s, with their own ID and external ID.
func seedVolumes(b *testing.B, endpoints []string, ids []string) {
	b.Helper()
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	prefix := runtime.DefaultClusterPrefix + "/volumes/"
	resp, err := cli.Get(ctx, prefix+ids[0])
	if err != nil || len(resp.Kvs) != 1 {
		b.Fatalf("the definition of %s: %v", ids[0], err)
	}
	tmpl := string(resp.Kvs[0].Value)
	rest := ids[1:]
	scaleParallel(b, (len(rest)+scaleSeedTxn-1)/scaleSeedTxn, func(i int) error {
		batch := rest[i*scaleSeedTxn : min(len(rest), (i+1)*scaleSeedTxn)]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, id := range batch {
			ops = append(ops, clientv3.OpPut(prefix+id, strings.ReplaceAll(tmpl, ids[0], id)))
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
}

// scaleParallel calls fn(0) to fn(n-1), scaleRegisterWorkers at a time,
// and fails b with the first error.
func scaleParallel(b *testing.B, n int, fn func(i int) error) {
	b.Helper()
	work := make(chan int)
	errs := make(chan error, scaleRegisterWorkers)
	var wg sync.WaitGroup
	for range scaleRegisterWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			wg.Wait()
			b.Fatal(err)
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
