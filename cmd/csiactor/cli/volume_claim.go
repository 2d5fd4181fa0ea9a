package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func volumeClaimCommand() *command {
	return clientLeaf(&command{
		name:    "claim",
		summary: "claim and publish a volume for an alloc; prints the target path",
		usage:   "csiactor volume claim [flags] VOLUME",
		help: `Claims the volume VOLUME for -alloc and publishes it
(POST /v1/volumes/VOLUME/claims); when it is published, prints its target
path. Claiming again with the same flags returns the same path.

With -wait, a claim that other claims keep out (the access mode's limit,
or the alloc's previous claim still being released) waits up to that long
for them to be released and freed instead of failing at once
(POST /v1/volumes/VOLUME/claims?wait=DURATION; at most 10m).

On a terminal it shows each step as it happens (reserved,
controller-published, staged, retries with their errors, published), from
the agent's events. -timeout bounds the wait for the claim to be published
(after any -wait): when it passes, the command fails and says so, and the
agent goes on with the claim (as it does when the command is interrupted);
follow it with "csiactor volume status VOLUME" or give it up with
"csiactor volume release -alloc ALLOC VOLUME".

-read-only publishes the volume read-only whatever the mode and access
mode; -mount-flag (repeatable) adds mount flags to the volume's for this
claim (never shown); -mount-group GID makes the published volume group
GID with the setgid bit (through the plugin's VOLUME_MOUNT_GROUP, else by
the agent); -selinux-context mounts it with context="..." (hosts with
SELinux only). These options are part of the claim: claiming again with
other ones is a conflict.

With -ephemeral PLUGIN, a VOLUME that is not registered is created first
through PLUGIN's controller as an ephemeral volume (of -ephemeral-capacity,
with the -ephemeral-parameter, -ephemeral-fs-type and -ephemeral-mount-flag
given, and the claim's access and attachment modes as its capability); it
is deleted through the controller once its last claim is freed. On an
ephemeral VOLUME that exists it is a claim like any other; on a VOLUME that
is not ephemeral the agent refuses it (409). Not with -wait.

Example:
  csiactor volume claim -alloc web-1 -mode write -access-mode single-node-writer data1
  csiactor volume claim -alloc web-2 -mode write -access-mode single-node-writer \
    -read-only -mount-flag noexec -mount-group 1000 data2
  csiactor volume claim -alloc job-7 -mode write -access-mode single-node-writer \
    -ephemeral hostpath.csi.k8s.io -ephemeral-capacity 1GiB scratch-job-7`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		alloc := fs.String("alloc", "", "the claiming alloc's `id` (required)")
		mode := fs.String("mode", "", "claim `mode`: read or write (required)")
		access := fs.String("access-mode", "", "access `mode`, one of the volume's capabilities (required)")
		attach := fs.String("attachment-mode", "file-system", "attachment `mode`: file-system or block-device")
		wait := fs.String("wait", "", "wait up to `duration` (like 30s) for conflicting claims to go")
		timeout := fs.Duration("timeout", defaultClaimTimeout, "how long to wait for the claim to be published, after any -wait; the agent goes on after it")
		ephPlugin := fs.String("ephemeral", "", "create VOLUME, if it is not registered, as an ephemeral volume of plugin `name`")
		ephCapacity := fs.String("ephemeral-capacity", "", "the ephemeral volume's `size`, like 1GiB (default: the plugin's)")
		var ephParams kvFlag
		fs.Var(&ephParams, "ephemeral-parameter", "`KEY=VALUE` CreateVolume parameter of the ephemeral volume (repeatable)")
		ephFSType := fs.String("ephemeral-fs-type", "", "file-system `type` of the ephemeral volume, like ext4")
		var ephMountFlags listFlag
		fs.Var(&ephMountFlags, "ephemeral-mount-flag", "mount `flag` of the ephemeral volume (repeatable; never shown)")
		readOnly := fs.Bool("read-only", false, "publish the volume read-only")
		var mountFlags listFlag
		fs.Var(&mountFlags, "mount-flag", "mount `flag` added to the volume's for this claim (repeatable; never shown)")
		mountGroup := fs.Int64("mount-group", -1, "`gid` the published volume is given (group and setgid); -1 for none")
		selinux := fs.String("selinux-context", "", "SELinux `context` to mount the volume with")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args, "VOLUME"); err != nil {
				return err
			}
			switch {
			case *alloc == "":
				return usagef("-alloc is required")
			case *mode == "":
				return usagef("-mode is required (read or write)")
			case *access == "":
				return usagef("-access-mode is required")
			}
			if err := checkID("VOLUME", args[0]); err != nil {
				return err
			}
			req := runtime.ClaimRequest{
				Alloc: *alloc, Mode: *mode, AccessMode: *access, AttachmentMode: *attach,
				ReadOnly: *readOnly, MountFlags: mountFlags, SELinuxContext: *selinux,
			}
			if *mountGroup != -1 {
				req.MountGroup = mountGroup
			}
			switch {
			case *ephPlugin != "" && *wait != "":
				return usagef("-wait is not available with -ephemeral")
			case *ephPlugin != "":
				req.Ephemeral = &runtime.EphemeralSpec{Plugin: *ephPlugin, Parameters: ephParams.m,
					Capability: runtime.EphemeralCapability{FSType: *ephFSType, MountFlags: ephMountFlags}}
				if *ephCapacity != "" {
					n, err := parseSize(*ephCapacity)
					if err != nil {
						return usagef("-ephemeral-capacity: %s", err)
					}
					req.Ephemeral.CapacityBytes = n
				}
			case *ephCapacity != "" || len(ephParams.m) > 0 || *ephFSType != "" || len(ephMountFlags) > 0:
				return usagef("-ephemeral-capacity, -ephemeral-parameter, -ephemeral-fs-type and -ephemeral-mount-flag need -ephemeral PLUGIN")
			}
			if err := usageFromField(req.Validate(), claimFlagNames); err != nil {
				return err
			}
			var d time.Duration
			if *wait != "" {
				var werr error
				if d, werr = runtime.ParseClaimWait(*wait); werr != nil {
					return usageFromField(werr, flagNames{"wait": "-wait"})
				}
			}
			if *timeout <= 0 {
				return usagef("-timeout must be positive")
			}
			c, err := claimWithProgress(ctx, e, cl, args[0], req, d, *timeout, !cf.json && isTerminal(e.stdout))
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, c)
			}
			fmt.Fprintln(e.stdout, c.TargetPath)
			return nil
		}
	})
}

func volumeReleaseCommand() *command {
	return clientLeaf(&command{
		name:    "release",
		summary: "release an alloc's claim on a volume",
		usage:   "csiactor volume release [flags] VOLUME",
		help: `Releases the claim of -alloc on VOLUME (DELETE /v1/volumes/VOLUME/claims/ALLOC).
It returns as soon as the claim is recorded as a past claim; the agent then
unpublishes and detaches it in the background, retrying until done. Follow
it with "csiactor volume status VOLUME".

With -force, the way out of a teardown that a broken plugin refuses
forever (DELETE /v1/volumes/VOLUME/claims/ALLOC?force=true): the agent sends
each teardown RPC the claim still needs once, whatever they answer, and
forgets the claim; the volume can be claimed again at once. It prints what
may be left (a target mount, a staging, a controller attachment) with each
RPC's error, as does the event claim-force-released. A claim not yet
released is released first, then forced the same way.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		alloc := fs.String("alloc", "", "the claiming alloc's `id` (required)")
		force := fs.Bool("force", false, "one last best-effort teardown, then forget the claim")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args, "VOLUME"); err != nil {
				return err
			}
			if *alloc == "" {
				return usagef("-alloc is required")
			}
			if err := checkID("VOLUME", args[0]); err != nil {
				return err
			}
			if err := checkID("-alloc", *alloc); err != nil {
				return err
			}
			if *force {
				return forceRelease(ctx, e, cl, cf, args[0], *alloc)
			}
			c, err := waitNotice(ctx, e, cl, args[0], *alloc, func() (runtime.Claim, error) { return cl.Release(ctx, args[0], *alloc) })
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, c)
			}
			fmt.Fprintf(e.stdout, "Released the claim of %s on %s (state %s)\n", c.Alloc, args[0], c.State)
			return nil
		}
	})
}

func forceRelease(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, vol, alloc string) error {
	fr, err := cl.ForceRelease(ctx, vol, alloc)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(e.stdout, fr)
	}
	fmt.Fprintf(e.stdout, "Forced the release of the claim of %s on %s: it is forgotten\n", fr.Alloc, vol)
	if len(fr.Left) == 0 {
		fmt.Fprintln(e.stdout, "Its last teardown succeeded; nothing is left")
		return nil
	}
	fmt.Fprintln(e.stdout, "May be left (clean up by hand):")
	for _, l := range fr.Left {
		fmt.Fprintf(e.stdout, "  %s\n", l)
	}
	return nil
}
