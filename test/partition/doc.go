// Package partition holds tests of cluster mode under real network
// partitions; it has no code.
//
// # Set-up
//
// Each test makes a hub network namespace holding a bridge, and one
// namespace per machine: three etcd members (m1-m3, 10.213.0.11-13) and
// three agents (n1-n3, 10.213.0.21-23). Each machine's namespace has an
// eth0 that is one end of a veth pair whose other end is a port of the
// bridge; the pairs are created inside the hub and moved at once, so the
// machine's own interfaces, addresses and routes are never touched. The
// members are the test binary itself run again in member mode (an
// environment variable makes TestMain run go.etcd.io/etcd/server/v3/embed
// instead of the tests), each started with `nsenter --net=` in its
// namespace; they also listen on a unix socket, through which the test
// process, which stays in the machine's namespace, watches them. The
// agents are the csiactor binary (built with -race when the tests are),
// started the same way, each exec-managing the example plugin on a
// shared storage directory and, where $CSIACTOR_HOSTPATH_PLUGIN names it,
// the kubernetes-csi hostpath driver. nsenter enters only the network
// namespace: the bind mounts the plugins make are in the test's mount
// table, and the agents' API sockets are files the test reaches.
//
// A partition drops packets: iptables DROP rules in the cut machine's
// namespace, for its traffic with the machines it is cut from. Healing
// flushes them. Deleting the namespaces at the end removes links,
// addresses and rules with them; processes are killed and mounts removed
// first, whatever the outcome.
//
// # Cases
//
// TestPartitions cuts one agent from every member, then the etcd
// leader's member from the other members, healing each, while workers on
// every agent claim and release single-writer volumes and a prober on
// each agent claims every 100 ms. It checks that no two claims of a
// single-writer volume were held at once, that the cut agent refused
// claims before the server expired its lease (both times logged), that
// every agent admits claims and keeps its lease while the leader's member
// is cut off, that claims published before stay published, mounted and
// writable, and that every agent admits claims again after each heal.
//
// While the old leader's member is cut off, every agent must go on: the
// agents ask etcd for a member with a leader, so the cut member answers
// their requests at once once it has stepped down, instead of holding them
// until they time out, and a lease renewal that fails is tried again on
// another member within the renewal interval. The test asserts that every
// agent admits claims under the new leader and that no lease expires.
//
// The tests need root and the ip, iptables and nsenter commands; they
// skip with a message where these are missing or `ip netns add` fails,
// and under -short. $CSIACTOR_PARTITION_BINARY, when set, names a
// csiactor binary to run instead of building one.
package partition
