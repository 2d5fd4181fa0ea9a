package partition

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

// subnet holds every address of a test's network: the hosts are
// subnet.<n>/24 on the eth0 of their namespaces. The addresses exist only
// inside the test's namespaces, so they never meet the machine's own.
const subnet = "10.213.0"

// network is one test's namespaces: a hub namespace holding bridge br0,
// and per host a namespace whose eth0 is one end of a veth pair, the other
// end a port of br0. Everything is made inside the namespaces (the veth
// pairs are created in the hub, one end moved at once to the host's
// namespace): nothing is added to the machine's own interfaces or routes.
// Deleting the namespaces (in t's cleanup) removes the links, addresses
// and iptables rules with them.
type network struct {
	t      *testing.T
	prefix string // of the namespaces' names
	hub    string
	hosts  map[string]string // host name → its address
}

var netSeq atomic.Int32

// newNetwork makes the hub namespace; it skips t where namespaces cannot
// be made (not root, no ip command, or `ip netns add` refused).
func newNetwork(t *testing.T) *network {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("partition tests make network namespaces, veth pairs and iptables rules: they need root")
	}
	for _, c := range []string{"ip", "iptables", "nsenter"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("partition tests need the %s command (Debian: iproute2, iptables, util-linux): %v", c, err)
		}
	}
	n := &network{t: t, prefix: fmt.Sprintf("csipt%d-%d-", os.Getpid(), netSeq.Add(1)), hosts: map[string]string{}}
	n.hub = n.prefix + "hub"
	if out, err := exec.Command("ip", "netns", "add", n.hub).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here (ip netns add %s: %v: %s)", n.hub, err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(n.remove)
	n.ip("-n", n.hub, "link", "add", "br0", "type", "bridge")
	n.ip("-n", n.hub, "link", "set", "br0", "up")
	return n
}

// remove deletes every namespace of the test. The processes run in them
// must be gone first (their cleanups run before this one).
func (n *network) remove() {
	for _, ns := range append(n.namespaces(), n.hub) {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			n.t.Errorf("cleanup: ip netns del %s: %v: %s", ns, err, out)
		}
	}
}

func (n *network) namespaces() []string {
	var out []string
	for h := range n.hosts {
		out = append(out, n.ns(h))
	}
	return out
}

// ns is the namespace of host.
func (n *network) ns(host string) string { return n.prefix + host }

// nsPath is the file that names host's namespace, for nsenter --net.
func (n *network) nsPath(host string) string { return "/run/netns/" + n.ns(host) }

// addHost makes host's namespace, joined to the hub by a veth pair, with
// address subnet.<octet>/24 on its eth0 and loopback up; it returns the
// address.
func (n *network) addHost(host string, octet int) string {
	n.t.Helper()
	ns := n.ns(host)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		n.t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	addr := fmt.Sprintf("%s.%d", subnet, octet)
	n.hosts[host] = addr
	port := "v-" + host // in the hub
	n.ip("-n", n.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
	n.ip("-n", n.hub, "link", "set", port, "master", "br0", "up")
	n.ip("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
	n.ip("-n", ns, "link", "set", "eth0", "up")
	n.ip("-n", ns, "link", "set", "lo", "up")
	return addr
}

// cut drops every packet between host and each of peers, in both
// directions, by iptables rules in host's namespace. The rules are
// committed in one iptables-restore transaction, so on return every
// packet between them is dropped and none was before: a test takes the
// time of the cut after cut returns.
func (n *network) cut(host string, peers ...string) {
	n.t.Helper()
	var rules strings.Builder
	rules.WriteString("*filter\n")
	for _, p := range peers {
		fmt.Fprintf(&rules, "-A INPUT -s %s -j DROP\n-A OUTPUT -d %s -j DROP\n", n.hosts[p], n.hosts[p])
	}
	rules.WriteString("COMMIT\n")
	cmd := exec.Command("nsenter", "--net="+n.nsPath(host), "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(rules.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("iptables-restore in %s: %v: %s", n.ns(host), err, out)
	}
}

// heal removes every rule cut added in host's namespace.
func (n *network) heal(host string) {
	n.t.Helper()
	n.iptables(host, "-F", "INPUT")
	n.iptables(host, "-F", "OUTPUT")
}

func (n *network) iptables(host string, args ...string) {
	n.t.Helper()
	full := append([]string{"--net=" + n.nsPath(host), "iptables", "-w"}, args...)
	if out, err := exec.Command("nsenter", full...).CombinedOutput(); err != nil {
		n.t.Fatalf("iptables %s in %s: %v: %s", strings.Join(args, " "), n.ns(host), err, out)
	}
}

func (n *network) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// command returns cmd run in host's namespace (nsenter enters only the
// network namespace: the process shares the test's mount namespace, so
// the mounts it makes are in the test's mount table).
func (n *network) command(host, name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + n.nsPath(host), "--", name}, args...)...)
}
