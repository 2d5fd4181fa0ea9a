package csi

import (
	"slices"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Service names the CSI service a method belongs to.
type Service string

// The three CSI services.
const (
	ServiceIdentity   Service = "Identity"
	ServiceController Service = "Controller"
	ServiceNode       Service = "Node"
	// ServiceGroupController is the volume group snapshot service (CSI
	// 1.9+), served by the controller.
	ServiceGroupController Service = "GroupController"
)

// Method is one RPC of the CSI spec this package is built with, taken from
// its protobuf descriptor: every method of the Identity, Controller, Node
// and GroupController services (all unary).
type Method struct {
	// Name is the method's short name, like "CreateVolume".
	Name string
	// FullName is its gRPC name, like "/csi.v1.Controller/CreateVolume".
	FullName string
	// Service is the service it belongs to.
	Service Service

	in, out protoreflect.MessageType
}

// NewRequest returns an empty request message of m.
func (m Method) NewRequest() proto.Message { return m.in.New().Interface() }

// NewResponse returns an empty response message of m.
func (m Method) NewResponse() proto.Message { return m.out.New().Interface() }

// methods are every CSI method, by service (Identity, Controller, Node,
// GroupController), then name.
var methods = func() []Method {
	var out []Method
	svcs := csipb.File_csi_proto.Services()
	for _, svc := range []Service{ServiceIdentity, ServiceController, ServiceNode, ServiceGroupController} {
		sd := svcs.ByName(protoreflect.Name(svc))
		var ms []Method
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			in, err1 := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
			out, err2 := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
			if err1 != nil || err2 != nil || md.IsStreamingClient() || md.IsStreamingServer() {
				continue // not in this build of the spec, or not unary
			}
			ms = append(ms, Method{
				Name:     string(md.Name()),
				FullName: "/" + string(sd.FullName()) + "/" + string(md.Name()),
				Service:  svc,
				in:       in, out: out,
			})
		}
		slices.SortFunc(ms, func(a, b Method) int { return strings.Compare(a.Name, b.Name) })
		out = append(out, ms...)
	}
	return out
}()

// Methods returns every CSI method, by service (Identity, Controller,
// Node, GroupController), then name.
func Methods() []Method { return slices.Clone(methods) }

// MethodNames returns the short names of every CSI method, in the order
// of Methods.
func MethodNames() []string {
	names := make([]string, len(methods))
	for i, m := range methods {
		names[i] = m.Name
	}
	return names
}

// LookupMethod finds a CSI method by its short name ("NodeGetInfo") or its
// gRPC name ("/csi.v1.Node/NodeGetInfo"). Short names are unique across
// the three services.
func LookupMethod(name string) (Method, bool) {
	for _, m := range methods {
		if m.Name == name || m.FullName == name {
			return m, true
		}
	}
	return Method{}, false
}
