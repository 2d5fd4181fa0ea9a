package partition

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/internal/testbin"
)

// binaryEnv names an environment variable that, when set, is the path of
// the csiactor binary to run instead of building one.
const binaryEnv = "CSIACTOR_PARTITION_BINARY"

var binary = &testbin.Binary{Kind: "partition test", Prefix: "csipt-bin-", Race: raceEnabled, Env: binaryEnv}

// memberEnv, when set, makes the test binary an etcd member instead of
// running tests: its value is the member's memberConfig as JSON. The tests
// start each member this way, inside its own network namespace.
const memberEnv = "CSIACTOR_PARTITION_ETCD_MEMBER"

// memberConfig is what a member process needs.
type memberConfig struct {
	Name    string `json:"name"`
	Dir     string `json:"dir"`
	Addr    string `json:"addr"`    // its address in its namespace
	Socket  string `json:"socket"`  // a client listener on a unix socket, for the test process
	Cluster string `json:"cluster"` // the initial cluster, name=peer URL,...
}

func TestMain(m *testing.M) {
	if c := os.Getenv(memberEnv); c != "" {
		os.Exit(runMember(c))
	}
	binary.Main(m)
}

// runMember runs an etcd member until SIGTERM, or until its stdin ends
// (the test process is gone), and returns the exit code. It prints
// "ready" once the member serves.
func runMember(js string) int {
	var mc memberConfig
	if err := json.Unmarshal([]byte(js), &mc); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", memberEnv, err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = mc.Name, mc.Dir
	client := url.URL{Scheme: "http", Host: mc.Addr + ":2379"}
	peer := url.URL{Scheme: "http", Host: mc.Addr + ":2380"}
	cfg.ListenClientUrls = []url.URL{client, {Scheme: "unix", Path: mc.Socket}}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = mc.Cluster
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// As internal/etcdtest: a leader is elected within about a second of
	// the old one going silent.
	cfg.TickMs, cfg.ElectionMs = 50, 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "start etcd member %s: %v\n", mc.Name, err)
		return 1
	}
	defer e.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	stdin := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdin)
	}()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("ready")
	case <-time.After(2 * time.Minute):
		fmt.Fprintf(os.Stderr, "etcd member %s not ready after 2m\n", mc.Name)
		return 1
	case <-sigs:
		return 0
	case <-stdin:
		return 0
	}
	select {
	case <-sigs:
	case <-stdin:
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd member %s: %v\n", mc.Name, err)
		return 1
	}
	return 0
}
