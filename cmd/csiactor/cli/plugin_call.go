package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// requestFlag is plugin call's -json: the request message, which takes
// the place of the client flags' -json (the answer is always JSON).
type requestFlag struct{ s string }

func (f *requestFlag) String() string     { return f.s }
func (f *requestFlag) Set(s string) error { f.s = s; return nil }

var callFlagNames = flagNames{"method": "METHOD", "type": "-type", "request": "-json"}

func pluginCallCommand() *command {
	return clientLeaf(&command{
		name:    "call",
		summary: "send one CSI call to a plugin and print the answer as JSON",
		usage:   "csiactor plugin call [-type controller|node] [-json REQUEST] [flags] NAME METHOD",
		help: `Sends one CSI RPC, METHOD (like NodeGetInfo or CreateVolume), to the
allocation of the plugin NAME that operations of its type go to now
(POST /v1/plugins/NAME/call), and prints where it went, the request and
the plugin's answer as JSON, every secret and mount flag replaced by
"***stripped***". -json is the request message in protobuf JSON (field
names as in the CSI spec, like {"volume_id":"v1"}); none is an empty
request. -type picks the allocation for an identity method (node by
default, the controller for a plugin without nodes); controller and node
methods go to their own. An unknown method or a request that is not
JSON of the method's request message is a usage error (exit 2); a call
the plugin fails prints its gRPC code and message (exit 1).`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		typ := fs.String("type", "", "the allocation `type` to call: controller or node")
		req := &requestFlag{}
		jf := fs.Lookup("json") // the client flags' -json, a request here
		jf.Value, jf.DefValue = req, ""
		jf.Usage = "the `REQUEST` message in protobuf JSON, like {\"volume_id\":\"v1\"}"
		return func(ctx context.Context, e *env, cl *api.Client, _ *clientFlags, args []string) error {
			if err := wantArgs(args, "NAME", "METHOD"); err != nil {
				return err
			}
			if err := checkID("NAME", args[0]); err != nil {
				return err
			}
			call := runtime.PluginCall{Method: args[1], Type: *typ}
			if req.s != "" {
				if !json.Valid([]byte(req.s)) {
					return usagef("-json: %q is not JSON", req.s)
				}
				call.Request = json.RawMessage(req.s)
			}
			if err := usageFromField(call.Validate(), callFlagNames); err != nil {
				return err
			}
			res, err := cl.CallPlugin(ctx, args[0], call)
			if err != nil {
				return err
			}
			if err := printJSON(e.stdout, res); err != nil {
				return err
			}
			if res.Error != nil {
				return fmt.Errorf("plugin %s (allocation %s) failed %s: %s: %s", res.Plugin, res.Alloc, res.Method, res.Error.Code, res.Error.Message)
			}
			return nil
		}
	})
}
