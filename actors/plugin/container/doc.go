// Package container runs the plugins of image allocations in containers,
// through a container engine's API socket: dockerd's, or Podman's
// Docker-compatible service (`podman system service`). It is the
// container-managed counterpart of package proc.
//
// # Basics
//
// [Image] is an allocation's "image" object and [Image.Validate] checks
// it. [Launcher.Start] makes sure the engine holds the image (by its pull
// policy), creates the container with what a node plugin needs and starts
// it: the host's /dev, the plugin's socket directory at the same path,
// the agent's volumes directory with rshared propagation (so mounts the
// plugin makes reach the host and the workloads), SYS_ADMIN by default for
// node and monolith plugins (with seccomp and AppArmor unconfined when
// capabilities are added), the host's network and PID namespaces only
// when asked. Each container is labelled with its allocation ([LabelAlloc])
// and the agent's data dir ([LabelDataDir]); [Launcher.Find] finds the
// containers a previous agent left by those labels, and [Launcher.Adopt]
// takes one over (same container ID, nothing restarted).
//
// A [Container] is watched through the engine's wait API, and the engine
// keeps its output: the agent copies each line, stamped with the engine's
// time, to the allocation's output files (see proc.Sink), and goes on
// after the last line kept there, so each line is kept and logged once
// across agents, including those written while no agent ran.
//
// # Caveats
//
// The engine must serve API 1.40 or later (dockerd 19.03, Podman 3). An
// engine that goes away is retried: [Container.Exited] is closed only
// once the engine says the container stopped or is gone.
package container
