package registration

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The plugin registration API v1 of the kubelet, as
// k8s.io/kubelet/pkg/apis/pluginregistration/v1 defines it in api.proto:
//
//	syntax = "proto3";
//	package pluginregistration;
//
//	message PluginInfo {
//	  string type = 1;
//	  string name = 2;
//	  string endpoint = 3;
//	  repeated string supported_versions = 4;
//	}
//	message RegistrationStatus {
//	  bool plugin_registered = 1;
//	  string error = 2;
//	}
//	message RegistrationStatusResponse {}
//	message InfoRequest {}
//
//	service Registration {
//	  rpc GetInfo(InfoRequest) returns (PluginInfo) {}
//	  rpc NotifyRegistrationStatus(RegistrationStatus) returns (RegistrationStatusResponse) {}
//	}
//
// The registration socket serves that service: the kubelet (here, the
// agent) calls GetInfo, then NotifyRegistrationStatus. We describe it with
// a descriptor built below and send dynamic messages, so the wire format
// (service and method names, field numbers and types) is the one the
// protobuf runtime derives from the same definition, without depending on
// the k8s.io/kubelet module (whose go.mod brings much of Kubernetes into
// the module graph) or on generated code.

// Plugin types of PluginInfo.Type.
const (
	// TypeCSIPlugin is a CSI driver: the only type the agent registers.
	TypeCSIPlugin = "CSIPlugin"
	// TypeDevicePlugin is a kubelet device plugin.
	TypeDevicePlugin = "DevicePlugin"
	// TypeDRAPlugin is a kubelet dynamic resource allocation plugin.
	TypeDRAPlugin = "DRAPlugin"
)

// Full method names of the Registration service.
const (
	ServiceName                        = "pluginregistration.Registration"
	MethodGetInfo                      = "/" + ServiceName + "/GetInfo"
	MethodNotifyRegistrationStatus     = "/" + ServiceName + "/NotifyRegistrationStatus"
	protoFile                          = "pluginregistration/api.proto"
	protoPackage                       = "pluginregistration"
	msgPluginInfo                      = "PluginInfo"
	msgRegistrationStatus              = "RegistrationStatus"
	msgRegistrationStatusResponse      = "RegistrationStatusResponse"
	msgInfoRequest                     = "InfoRequest"
	fieldPluginInfoType                = 1
	fieldPluginInfoName                = 2
	fieldPluginInfoEndpoint            = 3
	fieldPluginInfoSupportedVersions   = 4
	fieldRegistrationStatusRegistered  = 1
	fieldRegistrationStatusError       = 2
	methodNameGetInfo                  = "GetInfo"
	methodNameNotifyRegistrationStatus = "NotifyRegistrationStatus"
)

// PluginInfo is what a registrar answers to GetInfo.
type PluginInfo struct {
	// Type is TypeCSIPlugin for a CSI driver.
	Type string
	// Name is the driver's name (GetPluginInfo's name for a CSI driver).
	Name string
	// Endpoint is the CSI socket of the driver, as a path; empty means
	// the registration socket itself.
	Endpoint string
	// SupportedVersions are the CSI versions the driver speaks, like
	// "1.0.0".
	SupportedVersions []string
}

// RegistrationStatus is what the agent tells a registrar after GetInfo.
type RegistrationStatus struct {
	// PluginRegistered says whether the driver was registered.
	PluginRegistered bool
	// Error is why it was not.
	Error string
}

// descriptors of the messages, built once.
type descriptors struct {
	info, status, statusResp, infoReq protoreflect.MessageDescriptor
}

var descs = sync.OnceValues(buildDescriptors)

func buildDescriptors() (descriptors, error) {
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	boolean := descriptorpb.FieldDescriptorProto_TYPE_BOOL.Enum()
	optional := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	repeated := descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	field := func(name, json string, num int32, typ *descriptorpb.FieldDescriptorProto_Type, label *descriptorpb.FieldDescriptorProto_Label) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), JsonName: proto.String(json),
			Number: proto.Int32(num), Type: typ, Label: label}
	}
	typeName := func(msg string) *string { return proto.String("." + protoPackage + "." + msg) }
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String(protoFile),
		Package: proto.String(protoPackage),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String(msgPluginInfo), Field: []*descriptorpb.FieldDescriptorProto{
				field("type", "type", fieldPluginInfoType, str, optional),
				field("name", "name", fieldPluginInfoName, str, optional),
				field("endpoint", "endpoint", fieldPluginInfoEndpoint, str, optional),
				field("supported_versions", "supportedVersions", fieldPluginInfoSupportedVersions, str, repeated),
			}},
			{Name: proto.String(msgRegistrationStatus), Field: []*descriptorpb.FieldDescriptorProto{
				field("plugin_registered", "pluginRegistered", fieldRegistrationStatusRegistered, boolean, optional),
				field("error", "error", fieldRegistrationStatusError, str, optional),
			}},
			{Name: proto.String(msgRegistrationStatusResponse)},
			{Name: proto.String(msgInfoRequest)},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Registration"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String(methodNameGetInfo), InputType: typeName(msgInfoRequest), OutputType: typeName(msgPluginInfo)},
				{Name: proto.String(methodNameNotifyRegistrationStatus), InputType: typeName(msgRegistrationStatus), OutputType: typeName(msgRegistrationStatusResponse)},
			},
		}},
	}
	// Resolved against an empty registry: the file imports nothing, and
	// nothing is registered globally (an embedder may link the kubelet's
	// generated package, which registers the same names).
	f, err := protodesc.NewFile(fd, nil)
	if err != nil {
		return descriptors{}, fmt.Errorf("registration: build descriptor: %w", err)
	}
	m := f.Messages()
	return descriptors{
		info:       m.ByName(msgPluginInfo),
		status:     m.ByName(msgRegistrationStatus),
		statusResp: m.ByName(msgRegistrationStatusResponse),
		infoReq:    m.ByName(msgInfoRequest),
	}, nil
}

// mustDescs returns the descriptors; building them can only fail if the
// definition above is wrong, which every test would show.
func mustDescs() descriptors {
	d, err := descs()
	if err != nil {
		panic(err)
	}
	return d
}

func (i PluginInfo) message() *dynamicpb.Message {
	md := mustDescs().info
	m := dynamicpb.NewMessage(md)
	f := md.Fields()
	setString(m, f.ByNumber(fieldPluginInfoType), i.Type)
	setString(m, f.ByNumber(fieldPluginInfoName), i.Name)
	setString(m, f.ByNumber(fieldPluginInfoEndpoint), i.Endpoint)
	if len(i.SupportedVersions) > 0 {
		fd := f.ByNumber(fieldPluginInfoSupportedVersions)
		l := m.Mutable(fd).List()
		for _, v := range i.SupportedVersions {
			l.Append(protoreflect.ValueOfString(v))
		}
	}
	return m
}

func pluginInfoFrom(m *dynamicpb.Message) PluginInfo {
	f := m.Descriptor().Fields()
	i := PluginInfo{
		Type:     m.Get(f.ByNumber(fieldPluginInfoType)).String(),
		Name:     m.Get(f.ByNumber(fieldPluginInfoName)).String(),
		Endpoint: m.Get(f.ByNumber(fieldPluginInfoEndpoint)).String(),
	}
	l := m.Get(f.ByNumber(fieldPluginInfoSupportedVersions)).List()
	for k := range l.Len() {
		i.SupportedVersions = append(i.SupportedVersions, l.Get(k).String())
	}
	return i
}

func (s RegistrationStatus) message() *dynamicpb.Message {
	md := mustDescs().status
	m := dynamicpb.NewMessage(md)
	f := md.Fields()
	if s.PluginRegistered {
		m.Set(f.ByNumber(fieldRegistrationStatusRegistered), protoreflect.ValueOfBool(true))
	}
	setString(m, f.ByNumber(fieldRegistrationStatusError), s.Error)
	return m
}

func registrationStatusFrom(m *dynamicpb.Message) RegistrationStatus {
	f := m.Descriptor().Fields()
	return RegistrationStatus{
		PluginRegistered: m.Get(f.ByNumber(fieldRegistrationStatusRegistered)).Bool(),
		Error:            m.Get(f.ByNumber(fieldRegistrationStatusError)).String(),
	}
}

// setString sets a proto3 string field; the empty string is the default
// and is left unset, as generated code does.
func setString(m *dynamicpb.Message, fd protoreflect.FieldDescriptor, s string) {
	if s != "" {
		m.Set(fd, protoreflect.ValueOfString(s))
	}
}

// Client calls the Registration service of one registration socket.
type Client struct {
	cc *grpc.ClientConn
}

// NewClient returns a client of the registration socket at path (a unix
// socket). It connects lazily, on the first call; Close it when done.
func NewClient(path string, opts ...grpc.DialOption) (*Client, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient("unix://"+path, opts...)
	if err != nil {
		return nil, fmt.Errorf("registration socket %s: %w", path, err)
	}
	return &Client{cc: cc}, nil
}

// GetInfo asks the registrar what it registers.
func (c *Client) GetInfo(ctx context.Context) (PluginInfo, error) {
	d := mustDescs()
	out := dynamicpb.NewMessage(d.info)
	if err := c.cc.Invoke(ctx, MethodGetInfo, dynamicpb.NewMessage(d.infoReq), out); err != nil {
		return PluginInfo{}, err
	}
	return pluginInfoFrom(out), nil
}

// NotifyRegistrationStatus tells the registrar whether its driver was
// registered, and why not.
func (c *Client) NotifyRegistrationStatus(ctx context.Context, s RegistrationStatus) error {
	out := dynamicpb.NewMessage(mustDescs().statusResp)
	return c.cc.Invoke(ctx, MethodNotifyRegistrationStatus, s.message(), out)
}

// Close closes the connection.
func (c *Client) Close() error { return c.cc.Close() }

// Server is the registrar's side of the Registration service: what
// node-driver-registrar serves on its registration socket. Tests and Go
// programs that register a driver implement it and serve it with
// [RegisterServer].
type Server interface {
	// GetInfo says what to register.
	GetInfo(ctx context.Context) (PluginInfo, error)
	// NotifyRegistrationStatus receives the outcome.
	NotifyRegistrationStatus(ctx context.Context, s RegistrationStatus) error
}

// RegisterServer registers srv's Registration service on s.
func RegisterServer(s grpc.ServiceRegistrar, srv Server) {
	d := mustDescs()
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: ServiceName,
		HandlerType: (*Server)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: methodNameGetInfo, Handler: unary(MethodGetInfo, d.infoReq,
				func(ctx context.Context, srv Server, _ *dynamicpb.Message) (proto.Message, error) {
					i, err := srv.GetInfo(ctx)
					if err != nil {
						return nil, err
					}
					return i.message(), nil
				})},
			{MethodName: methodNameNotifyRegistrationStatus, Handler: unary(MethodNotifyRegistrationStatus, d.status,
				func(ctx context.Context, srv Server, in *dynamicpb.Message) (proto.Message, error) {
					if err := srv.NotifyRegistrationStatus(ctx, registrationStatusFrom(in)); err != nil {
						return nil, err
					}
					return dynamicpb.NewMessage(d.statusResp), nil
				})},
		},
		Metadata: protoFile,
	}, srv)
}

// unary adapts call to a grpc method handler that decodes its request as
// in and runs the server's interceptor, if any.
func unary(method string, in protoreflect.MessageDescriptor, call func(context.Context, Server, *dynamicpb.Message) (proto.Message, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		req := dynamicpb.NewMessage(in)
		if err := dec(req); err != nil {
			return nil, err
		}
		s := srv.(Server)
		if icpt == nil {
			return call(ctx, s, req)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: method}
		return icpt(ctx, req, info, func(ctx context.Context, r any) (any, error) {
			return call(ctx, s, r.(*dynamicpb.Message))
		})
	}
}
