// Package proc starts, watches and stops the processes of exec-managed
// plugin allocations.
//
// # Basics
//
// A [Launcher] owns one goroutine locked to one OS thread, and every
// process is started from it. Each process runs in its own process group
// (so stopping it stops its children too) and gets SIGKILL from the kernel
// when the agent dies (Pdeathsig), so a plugin never outlives a killed
// agent. [Process.Stop] sends SIGTERM to the group, then SIGKILL after a
// grace period, and always waits for the process, so no zombie is left.
// Standard output and error are written to a logrus entry, one line per
// entry.
//
// The PID and the start time read from /proc/<pid>/stat identify a process
// across agent restarts: [KillStale] stops a process left over from a
// previous run of the agent, and never a process that merely reuses its PID.
//
// # Caveats
//
// Linux only. Pdeathsig fires when the OS thread that started the process
// exits, not when the agent process exits; that is why all starts happen
// on the launcher's locked thread, and why the launcher, on Close, gives
// its thread back to the Go runtime (which keeps it) instead of letting
// the thread exit. Pdeathsig reaches only the plugin's own process, not
// processes the plugin started; those are stopped with the group by Stop.
package proc
