package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/csi"
)

// PluginCall is one raw CSI call (CallPlugin; POST
// /v1/plugins/{name}/call; `csiactor plugin call`).
type PluginCall struct {
	// Method is a CSI method by its short name ("NodeGetInfo") or its
	// gRPC name ("/csi.v1.Node/NodeGetInfo").
	Method string `json:"method"`
	// Type picks the allocation: TypeController or TypeNode. Empty means
	// the method's own service (identity methods: the node, or the
	// controller of a plugin without one); a controller method cannot go
	// to the node nor a node method to the controller.
	Type string `json:"type,omitempty"`
	// Request is the request message in protobuf JSON (protojson); empty
	// is an empty request.
	Request json.RawMessage `json:"request,omitempty"`
}

// PluginCallResult is the answer of CallPlugin: where the call went, and
// the plugin's answer or error. Request and Response are protobuf JSON
// with every secret and mount flag replaced by csi.Stripped.
type PluginCallResult struct {
	Plugin string `json:"plugin"`
	// Alloc is the allocation that answered.
	Alloc string `json:"alloc"`
	// Method is the method's short name; Type the allocation's role.
	Method   string          `json:"method"`
	Type     string          `json:"type"`
	Request  json.RawMessage `json:"request"`
	Response json.RawMessage `json:"response,omitempty"`
	// Error is the plugin's error, when the call failed there.
	Error *PluginCallError `json:"error,omitempty"`
}

// PluginCallError is a plugin's gRPC status: its code's name
// ("NotFound") and message (with the request's secrets scrubbed).
type PluginCallError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Parse checks c and returns its method, the roles it may go to, and its
// request message. Errors are *FieldError naming method, type or request;
// an unknown method's lists the valid ones.
func (c PluginCall) Parse() (csi.Method, []plugin.Role, proto.Message, error) {
	m, ok := csi.LookupMethod(c.Method)
	if !ok {
		what := "must not be empty"
		if c.Method != "" {
			what = fmt.Sprintf("%q is not a CSI method", c.Method)
		}
		return csi.Method{}, nil, nil, fieldErr("method", what+"; valid methods: "+strings.Join(csi.MethodNames(), ", "))
	}
	rs := roles(m)
	switch {
	case c.Type == "":
	case c.Type != TypeController && c.Type != TypeNode:
		return csi.Method{}, nil, nil, fieldErr("type", fmt.Sprintf("%q: want %s or %s", c.Type, TypeController, TypeNode))
	case m.Service == csi.ServiceIdentity:
		rs = []plugin.Role{plugin.Role(c.Type)}
	case string(rs[0]) != c.Type:
		return csi.Method{}, nil, nil, fieldErr("type", fmt.Sprintf("%s is a %s method; it cannot go to the %s", m.Name, strings.ToLower(string(m.Service)), c.Type))
	}
	req := m.NewRequest()
	if len(c.Request) > 0 {
		if err := protojson.Unmarshal(c.Request, req); err != nil {
			return csi.Method{}, nil, nil, fieldErr("request", fmt.Sprintf("not a %s in JSON: %s", req.ProtoReflect().Descriptor().FullName(), err.Error()))
		}
	}
	return m, rs, req, nil
}

// Validate checks c as Parse does.
func (c PluginCall) Validate() error {
	_, _, _, err := c.Parse()
	return err
}

// CallPlugin sends one CSI RPC to plugin name's allocation that operations
// of its type go to now, as forwarded by the CSI proxy (waiting, up to
// ctx's deadline or plugins.rpc_timeout, for a healthy one), and returns
// the answer with secrets stripped. A call the plugin fails is not an
// error: Result.Error has its code and message. Errors wrap ErrInvalid
// (a *FieldError: the method, type or request), ErrNotFound (no
// allocation of that type) or ErrPluginUnavailable (none healthy in
// time).
func (r *Runtime) CallPlugin(ctx context.Context, name string, c PluginCall) (PluginCallResult, error) {
	if err := ValidateID("plugin", name); err != nil {
		return PluginCallResult{}, err
	}
	m, rs, req, err := c.Parse()
	if err != nil {
		return PluginCallResult{}, err
	}
	if err := r.ready(); err != nil {
		return PluginCallResult{}, err
	}
	resp := m.NewResponse()
	alloc, err := r.forward(ctx, name, m, rs, req, resp)
	res := PluginCallResult{Plugin: name, Alloc: alloc, Method: m.Name, Request: strippedJSON(req)}
	res.Type = string(rs[0])
	if alloc != "" && len(rs) > 1 {
		res.Type = r.allocRole(ctx, name, alloc, rs)
	}
	if err != nil {
		st, ok := status.FromError(err)
		if alloc == "" || !ok {
			return PluginCallResult{}, mapErr(err)
		}
		res.Error = &PluginCallError{Code: st.Code().String(), Message: st.Message()}
		return res, nil
	}
	res.Response = strippedJSON(resp)
	return res, nil
}

// allocRole returns which of rs alloc serves plugin name in: the first
// whose target it is now.
func (r *Runtime) allocRole(ctx context.Context, name, alloc string, rs []plugin.Role) string {
	for _, role := range rs {
		if t, err := r.registry.Client(ctx, name, role); err == nil && t.Alloc == alloc {
			return string(role)
		}
	}
	return string(rs[0])
}

// strippedJSON renders m as protobuf JSON with its secrets stripped.
func strippedJSON(m proto.Message) json.RawMessage {
	s := csi.Sanitize(m)
	if !json.Valid([]byte(s)) { // "<unprintable ...>"
		b, _ := json.Marshal(s)
		return b
	}
	return json.RawMessage(s)
}
