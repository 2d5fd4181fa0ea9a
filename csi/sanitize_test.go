package csi

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/csiactor/csiactor/internal/fakeplugin"
)

const (
	secretValue = "s3cr3t-hunter2"
	secretFlag  = "password=flag-secret-opt"
)

var testSecrets = map[string]string{"password": secretValue, "token": "tok-" + secretValue}

func secretRequests() map[string]proto.Message {
	vc := mountCap("noatime", secretFlag)
	return map[string]proto.Message{
		"CreateVolume": &csipb.CreateVolumeRequest{Name: "v", Secrets: testSecrets, VolumeCapabilities: []*csipb.VolumeCapability{vc, mountCap(secretFlag)},
			Parameters: map[string]string{"tier": "gold"}},
		"DeleteVolume":              &csipb.DeleteVolumeRequest{VolumeId: "v", Secrets: testSecrets},
		"ControllerPublishVolume":   &csipb.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: "n", Secrets: testSecrets, VolumeCapability: vc},
		"ControllerUnpublishVolume": &csipb.ControllerUnpublishVolumeRequest{VolumeId: "v", NodeId: "n", Secrets: testSecrets},
		"NodeStageVolume":           &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", Secrets: testSecrets, VolumeCapability: vc},
		"NodePublishVolume":         &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", Secrets: testSecrets, VolumeCapability: vc},
		"ValidateVolumeCapabilities": &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: "v", Secrets: testSecrets,
			VolumeCapabilities: []*csipb.VolumeCapability{vc}},
		"ValidateVolumeCapabilitiesResponse": &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
			VolumeCapabilities: []*csipb.VolumeCapability{vc}}},
	}
}

func leaks(s string) bool {
	return strings.Contains(s, "hunter2") || strings.Contains(s, "flag-secret-opt")
}

func TestStripSecrets_RedactsAndKeepsOriginal(t *testing.T) {
	for name, req := range secretRequests() {
		t.Run(name, func(t *testing.T) {
			before := proto.Clone(req)
			stripped := StripSecrets(req)
			full, err := protojson.Marshal(stripped)
			if err != nil {
				t.Fatal(err)
			}
			if leaks(string(full)) {
				t.Fatalf("stripped message still holds a secret: %s", full)
			}
			if !strings.Contains(string(full), Stripped) {
				t.Fatalf("nothing marked stripped: %s", full)
			}
			if !proto.Equal(req, before) {
				t.Fatal("StripSecrets modified its argument")
			}
			if s := Sanitize(req); leaks(s) || !strings.Contains(s, Stripped) {
				t.Fatalf("Sanitize = %s", s)
			}
		})
	}
}

func TestStripSecrets_KeepsEverythingElse(t *testing.T) {
	req := &csipb.NodePublishVolumeRequest{
		VolumeId: "vol-1", TargetPath: "/t", Readonly: true, Secrets: map[string]string{"k": "v"},
		VolumeCapability: mountCap("ro", "password=x"), VolumeContext: map[string]string{"ctx": "value"},
	}
	got := StripSecrets(req).(*csipb.NodePublishVolumeRequest)
	if got.GetVolumeId() != "vol-1" || !got.GetReadonly() || got.GetVolumeContext()["ctx"] != "value" ||
		got.GetVolumeCapability().GetMount().GetFsType() != "ext4" {
		t.Fatalf("non-secret fields changed: %v", got)
	}
	if got.GetSecrets()["k"] != Stripped || len(got.GetSecrets()) != 1 {
		t.Fatalf("secrets = %v, want key kept, value stripped", got.GetSecrets())
	}
	if flags := got.GetVolumeCapability().GetMount().GetMountFlags(); len(flags) != 2 || flags[0] != Stripped || flags[1] != Stripped {
		t.Fatalf("mount flags = %v", flags)
	}
}

func TestStripSecrets_DropsUnknownFields(t *testing.T) {
	req := &csipb.NodeUnpublishVolumeRequest{VolumeId: "v"}
	req.ProtoReflect().SetUnknown(protowireString(99, "unknown-"+secretValue))
	if s := Sanitize(req); leaks(s) {
		t.Fatalf("unknown field printed: %s", s)
	}
	got := StripSecrets(req)
	if len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatal("unknown fields kept")
	}
}

// protowireString encodes field num as a length-delimited string.
func protowireString(num int, s string) protoreflect.RawFields {
	b := []byte{byte(num<<3 | 2)}
	if num >= 16 {
		b = []byte{byte(num<<3|2) | 0x80, byte(num >> 4)}
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func TestStripSecrets_Nil(t *testing.T) {
	if StripSecrets(nil) != nil {
		t.Fatal("StripSecrets(nil) != nil")
	}
	if got := Sanitize(nil); got != "null" {
		t.Fatalf("Sanitize(nil) = %q", got)
	}
	if got := Sanitize((*csipb.NodePublishVolumeRequest)(nil)); got != "null" {
		t.Fatalf("Sanitize(typed nil) = %q", got)
	}
}

// TestIsRedacted_EveryCSISecretField walks every message of the CSI spec and
// checks that each field carrying the csi_secret option is redacted, so a
// new spec version's secret fields are covered without a list to maintain.
func TestIsRedacted_EveryCSISecretField(t *testing.T) {
	var secret, other int
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			opt, _ := proto.GetExtension(fd.Options(), csipb.E_CsiSecret).(bool)
			switch {
			case opt:
				secret++
				if !isRedacted(fd) {
					t.Errorf("%s carries csi_secret but is not redacted", fd.FullName())
				}
			case fd.FullName() == mountFlagsField:
				if !isRedacted(fd) {
					t.Errorf("%s is not redacted", fd.FullName())
				}
			default:
				other++
				if isRedacted(fd) {
					t.Errorf("%s is redacted but not secret", fd.FullName())
				}
			}
		}
		nested := md.Messages()
		for i := range nested.Len() {
			walk(nested.Get(i))
		}
	}
	msgs := csipb.File_csi_proto.Messages()
	for i := range msgs.Len() {
		walk(msgs.Get(i))
	}
	if secret < 20 || other < 100 {
		t.Fatalf("found %d secret and %d other fields: the walk is broken", secret, other)
	}
}

func TestScrubError(t *testing.T) {
	secrets := secretValues(secretRequests()["NodeStageVolume"])
	if len(secrets) != 4 { // two secrets, two mount flags
		t.Fatalf("secretValues = %d values", len(secrets))
	}
	leaky, _ := anypb.New(wrapperspb.String("detail " + secretValue))
	clean, _ := anypb.New(wrapperspb.String("retry later"))
	st, err := status.New(codes.Internal, "mount -o "+secretFlag+" failed: bad password "+secretValue).WithDetails(leaky, clean)
	if err != nil {
		t.Fatal(err)
	}
	got := scrubError(st.Err(), secrets)
	gs := status.Convert(got)
	if gs.Code() != codes.Internal || leaks(gs.Message()) || !strings.Contains(gs.Message(), "mount -o "+Stripped+" failed") {
		t.Fatalf("scrubbed = %s / %q", gs.Code(), gs.Message())
	}
	if len(gs.Proto().GetDetails()) != 1 {
		t.Fatalf("details = %d, want the clean one only", len(gs.Proto().GetDetails()))
	}
	// No secret inside: the very same error comes back.
	plain := status.Error(codes.NotFound, "no such volume")
	if got := scrubError(plain, secrets); !errors.Is(got, plain) {
		t.Fatal("an error without secrets was rebuilt")
	}
	// A non-status error with a secret keeps its code and loses the secret.
	if got := scrubError(errors.New("echo "+secretValue), secrets); leaks(got.Error()) || Code(got) != codes.Unknown {
		t.Fatalf("non-status = %v", got)
	}
}

// TestClient_DebugLog_NoSecretsOrMountFlags drives the RPCs that carry
// secrets and mount flags through a debug-level logger, in both formats, with
// the plugin echoing the secrets in an error, and checks that neither the
// log nor the errors contain them.
func TestClient_DebugLog_NoSecretsOrMountFlags(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			log, buf := debugLogger(format)
			p, c := startPlugin(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true}, WithLogger(log))
			ctx := testCtx(t)
			dir := t.TempDir()
			vc := mountCap("noatime", secretFlag)

			cv, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "v", Secrets: testSecrets, VolumeCapabilities: []*csipb.VolumeCapability{vc}})
			if err != nil {
				t.Fatal(err)
			}
			id := cv.GetVolume().GetVolumeId()
			pub, err := c.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: fakeplugin.DefaultNodeID, Secrets: testSecrets, VolumeCapability: vc})
			if err != nil {
				t.Fatal(err)
			}
			staging := filepath.Join(dir, "staging")
			if err := c.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, Secrets: testSecrets,
				VolumeCapability: vc, PublishContext: pub.GetPublishContext()}); err != nil {
				t.Fatal(err)
			}
			pubReq := &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: filepath.Join(dir, "target"),
				Secrets: testSecrets, VolumeCapability: vc, PublishContext: pub.GetPublishContext()}
			if err := c.NodePublishVolume(ctx, pubReq); err != nil {
				t.Fatal(err)
			}
			// A plugin that echoes its input in an error.
			p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Internal,
				Message: "mount -o " + secretFlag + " failed for password " + secretValue})
			err = c.NodePublishVolume(ctx, pubReq)
			if Code(err) != codes.Internal || leaks(err.Error()) || !strings.Contains(err.Error(), "mount -o "+Stripped+" failed") {
				t.Fatalf("echoing error = %v", err)
			}

			out := buf.String()
			if leaks(out) {
				t.Fatalf("log leaks a secret or mount flag:\n%s", out)
			}
			for _, want := range []string{"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume", Stripped, "Internal"} {
				if !strings.Contains(out, want) {
					t.Errorf("log lacks %q:\n%s", want, out)
				}
			}
			if strings.Count(out, "CSI call") < 5 {
				t.Errorf("want a debug line per call:\n%s", out)
			}
		})
	}
}

func TestClient_InfoLevel_LogsNothing(t *testing.T) {
	log, buf := debugLogger("text")
	log.Logger.SetLevel(logrus.InfoLevel)
	_, c := startPlugin(t, fakeplugin.Config{}, WithLogger(log))
	if _, err := c.Probe(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "" {
		t.Fatalf("info-level logger got: %s", buf.String())
	}
}
