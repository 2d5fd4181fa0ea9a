package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func volumeUpdateCommand() *command {
	return clientLeaf(&command{
		name:    "update",
		summary: "change a registered volume's secrets, mount options, parameters or context",
		usage:   "csiactor volume update [flags] ID",
		help: `Replaces the definition of the registered volume ID with the one given
(PUT /v1/volumes/ID), with the flags of "volume register". Give the whole
definition: secrets and mount flags are never shown, so they cannot be read
back, and what is left out is removed.

The secrets may change at any time: the next RPCs of the volume use them.
The capabilities, mount options, parameters and context only while the
volume has no claim. The plugin and the external ID never change. It prints
the fields that changed (from the volume-updated event, which names them,
never their values), or that nothing did.
` + volumeSpecHelp + `

Example (rotate a secret of a claimed volume):
  csiactor volume update -plugin hostpath -external-id vol-7f3a \
    -capability single-node-writer -fs-type ext4 -mount-flag noatime \
    -secrets-file /etc/csiactor/data1.secrets data1`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		sf := addVolumeSpecFlags(fs)
		externalID := fs.String("external-id", "", "the plugin's `id` of the volume (required; cannot change)")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			spec, err := sf.registerSpec(args, *externalID)
			if err != nil {
				return err
			}
			// An update, never a registration: the volume must be there.
			_, err = cl.Volume(ctx, args[0])
			if errors.Is(err, runtime.ErrNotFound) {
				return fmt.Errorf("volume %s is not registered; register it with 'csiactor volume register': %w", args[0], err)
			}
			if err != nil {
				return err
			}
			since, _ := lastUpdate(ctx, cl, args[0])
			v, err := cl.RegisterVolume(ctx, args[0], spec)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			// What changed, as the agent's event says (names, no values).
			switch ev, ok := lastUpdate(ctx, cl, args[0]); {
			case !ok:
				fmt.Fprintf(e.stdout, "Updated volume %s\n", v.ID)
			case ev == nil, since != nil && !ev.Time.After(since.Time):
				fmt.Fprintf(e.stdout, "Volume %s is unchanged\n", v.ID)
			default:
				fmt.Fprintf(e.stdout, "Updated volume %s: %s\n", v.ID, strings.TrimPrefix(ev.Message, "volume updated: "))
			}
			return nil
		}
	})
}

// lastUpdate returns the agent's latest volume-updated event of volume id
// among its recent events, nil when there is none; ok is false when the
// events cannot be read (the update itself is what matters).
func lastUpdate(ctx context.Context, cl *api.Client, id string) (ev *runtime.Event, ok bool) {
	evs, err := cl.Events(ctx)
	if err != nil {
		return nil, false
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == runtime.EventVolumeUpdated && evs[i].Volume == id {
			return &evs[i], true
		}
	}
	return nil, true
}
