// Package proc starts, adopts, watches and stops the processes of
// exec-managed plugin allocations, and keeps their output.
//
// # Basics
//
// [Launcher.Start] starts a plugin process together with its log shim,
// each in its own session: neither dies with the agent, and a terminal's
// signals reach neither. The plugin's stdout and stderr are pipes to the
// shim, which appends every line, stamped with the time and the stream, to
// size-bounded rotated files in the plugin's output directory
// ([OutputFile], OutputFile.1, ...). The shim outlives the agent with the
// plugin, so no line is lost while no agent runs, and the plugin never
// writes to a pipe without a reader (which would kill it with SIGPIPE).
// The agent follows the file and logs each line too. [Process.Detach]
// logs every line the shim has written before it returns and records how
// far ([PositionFile]); the next [Adopt] or [Launcher.Start] in that
// directory goes on from there, so across agents each line is logged
// once. An agent that crashes records nothing: the next one logs the
// lines written from when it starts.
//
// The PIDs and start times (from /proc/<pid>/stat) of the plugin and its
// shim identify them across agent restarts ([State], written by the
// caller with [WriteState]): the next agent takes them over with [Adopt],
// or stops them with [KillLeftover]; a process that merely reuses a PID is
// never taken for them.
//
// Every process is watched through a pidfd (pidfd_open and poll), so the
// exit of an adopted process, which is not a child of this agent, is seen
// as fast as a child's. [Process.Stop] sends one SIGTERM to the plugin
// (not to its group: many plugins take a second SIGTERM as "exit now"),
// then SIGKILL to its process group after a grace period, and waits for
// the plugin, its shim and its output; whatever is left of the group gets
// SIGKILL once the plugin has exited. [Process.Detach] stops watching and
// leaves both running.
//
// [ReadOutput] and [FollowOutput] read a plugin's kept output, for the
// API.
//
// # Caveats
//
// Linux only (pidfd_open needs Linux 5.3). The log shim is this same
// program re-executed through /proc/self/exe with CSIACTOR_LOG_SHIM=1 in
// its environment: this package's init runs the shim instead of the
// program then, so any program that imports it (the csiactor binary, an
// embedder, a test binary) can start plugins, and an agent whose binary
// was replaced by an upgrade still can. The exit status of an adopted
// process is unknown (only its parent, init, learns it). A plugin started
// in the instant before an agent is killed, before its State is written,
// is unknown to the next agent; once it listens on its socket,
// [KillListener] finds it there (SO_PEERCRED). One that has not listened
// yet when the next agent starts its own may still race it for the
// socket.
package proc
