// Package proxy tests the agent's CSI proxy sockets (plugins.proxy) and
// `csiactor plugin call` against real plugins in their own processes: the
// example plugin, and the kubernetes-csi hostpath driver where
// $CSIACTOR_HOSTPATH_PLUGIN names a build of it. The csi-test sanity suite
// runs through the proxy; a stream of calls goes on through it while the
// plugin is handed over to a newer allocation; a call under way on an
// allocation that stops or is deregistered (a fake plugin holding it) is
// sent again to its successor; `plugin call` sends
// identity, controller and node calls and is refused what it must refuse.
package proxy
