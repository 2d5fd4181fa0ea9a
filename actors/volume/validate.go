package volume

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// validation is the answer of ValidateVolumeCapabilities.
type validation struct {
	confirmed bool
	message   string
	// refused are the indexes of the capabilities the plugin did not
	// confirm when asked about each alone; empty when there was one, or
	// when asking alone did not tell.
	refused []int
}

// csiCapabilities returns s's capabilities as CSI sends them: the mount
// options go with the file-system ones.
func (s Spec) csiCapabilities() []*csipb.VolumeCapability {
	out := make([]*csipb.VolumeCapability, 0, len(s.Capabilities))
	for _, c := range s.Capabilities {
		c.MountOptions = s.MountOptions
		if c.AttachmentMode != csi.AttachmentModeFileSystem {
			c.MountOptions = nil
		}
		out = append(out, c.ToCSI())
	}
	return out
}

// validateRequest is the ValidateVolumeCapabilities request for s.
func (s Spec) validateRequest() *csipb.ValidateVolumeCapabilitiesRequest {
	return &csipb.ValidateVolumeCapabilitiesRequest{
		VolumeId:           s.ExternalID,
		VolumeContext:      s.Context,
		VolumeCapabilities: s.csiCapabilities(),
		Parameters:         s.Parameters,
		Secrets:            s.Secrets,
	}
}

// validate sends req; when the plugin does not confirm several
// capabilities, it asks about each alone to learn which it refuses.
func validate(ctx context.Context, c csi.Client, req *csipb.ValidateVolumeCapabilitiesRequest) (*validation, error) {
	resp, err := c.ValidateVolumeCapabilities(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.GetConfirmed() != nil {
		return &validation{confirmed: true}, nil
	}
	v := &validation{message: resp.GetMessage()}
	if len(req.VolumeCapabilities) < 2 {
		return v, nil
	}
	for i, vc := range req.VolumeCapabilities {
		one := &csipb.ValidateVolumeCapabilitiesRequest{
			VolumeId:           req.VolumeId,
			VolumeContext:      req.VolumeContext,
			VolumeCapabilities: []*csipb.VolumeCapability{vc},
			Parameters:         req.Parameters,
			Secrets:            req.Secrets,
		}
		r, err := c.ValidateVolumeCapabilities(ctx, one)
		if err != nil {
			return &validation{message: v.message}, nil // cannot tell which
		}
		if r.GetConfirmed() == nil {
			v.refused = append(v.refused, i)
		}
	}
	return v, nil
}

// validated finishes a Register after ValidateVolumeCapabilities, or after
// finding no controller to ask; Manager.Register says what each answer
// means.
func (a *volumeActor) validated(req *registerRequest, msg *opFinished) {
	spec := req.spec
	if err := req.ctx.Err(); err != nil {
		// The caller is gone; it learns the outcome by registering again.
		answer(req.reply, reply{err: err})
		return
	}
	note, err := validationOutcome(spec, msg.res, msg.out)
	if err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	if note != "" {
		log := a.log.WithFields(logrus.Fields{"plugin": spec.Plugin, "external_id": spec.ExternalID})
		if msg.res.Err != nil {
			log = log.WithError(msg.res.Err)
		}
		log.Info(note)
	}
	a.record(req, spec.record(time.Now()), "register")
}

// validationOutcome decides, from the result of ValidateVolumeCapabilities
// of spec (res, and out, the *validation it returned), whether the volume
// is registered (err nil) or refused (the error to answer); Manager.Register
// says what each answer means. note, when not empty, says why a volume is
// registered without validation (res.Err, if any, is the detail): the
// caller logs it.
func validationOutcome(spec Spec, res claim.Result, out any) (note string, err error) {
	switch code := csi.Code(res.Err); {
	case res.Unavailable:
		return "no controller of the plugin can be asked now; registering the volume without validating it", nil
	case res.Err == nil:
		v, _ := out.(*validation)
		if v == nil || !v.confirmed {
			return "", notConfirmed(spec, v)
		}
	case code == codes.Unimplemented:
		return "the plugin does not implement ValidateVolumeCapabilities; registering the volume without validating it", nil
	case code == codes.NotFound:
		return "", kinderr.Errorf(ErrNotFound,
			"plugin %q says volume %q (external_id) does not exist: %w", spec.Plugin, spec.ExternalID, res.Err)
	case code == codes.InvalidArgument:
		return "", kinderr.Errorf(ErrInvalid,
			"plugin %q refused ValidateVolumeCapabilities of volume %q: %w", spec.Plugin, spec.ExternalID, res.Err)
	case res.Outcome.Retryable():
		return "ValidateVolumeCapabilities did not answer now; registering the volume without validating it", nil
	default:
		return "", kinderr.Errorf(ErrPluginCall,
			"ValidateVolumeCapabilities of volume %q of plugin %q: %w", spec.ExternalID, spec.Plugin, res.Err)
	}
	return "", nil
}

// notConfirmed is the ErrInvalid of a plugin that did not confirm spec's
// capabilities. The plugin's message is scrubbed of spec's secrets and
// mount flags, as the csi package scrubs plugin errors.
func notConfirmed(spec Spec, v *validation) error {
	var refused []string
	known := v != nil && len(v.refused) > 0
	if known {
		for _, i := range v.refused {
			refused = append(refused, capName(spec.Capabilities[i].AccessMode, spec.Capabilities[i].AttachmentMode))
		}
	}
	if !known {
		for _, c := range spec.Capabilities {
			refused = append(refused, capName(c.AccessMode, c.AttachmentMode))
		}
	}
	what := "does not support capability " + refused[0]
	switch {
	case len(refused) > 1 && known:
		what = "does not support capabilities " + strings.Join(refused, ", ")
	case len(refused) > 1:
		what = "did not confirm capabilities " + strings.Join(refused, ", ")
	}
	err := kinderr.Errorf(ErrInvalid, "plugin %q %s for volume %q", spec.Plugin, what, spec.ExternalID)
	if v != nil && v.message != "" {
		err = fmt.Errorf("%w: %s", err, scrub(v.message, spec))
	}
	return err
}

func capName(am csi.AccessMode, at csi.AttachmentMode) string {
	return am.String() + "/" + at.String()
}

// scrub replaces every secret value and mount flag of spec in s with
// csi.Stripped, longest first, so that a value containing another is
// hidden whole.
func scrub(s string, spec Spec) string {
	var hide []string
	for _, v := range spec.Secrets {
		hide = append(hide, v)
	}
	if spec.MountOptions != nil {
		hide = append(hide, spec.MountOptions.MountFlags...)
	}
	slices.SortFunc(hide, func(a, b string) int { return len(b) - len(a) })
	for _, h := range hide {
		if h != "" {
			s = strings.ReplaceAll(s, h, csi.Stripped)
		}
	}
	return s
}

// claimsHeld says how many claims and past claims a volume has, as in
// "1 claim and 2 past claims not yet freed".
func claimsHeld(claims, past int) string {
	n := func(k int, what string) string {
		if k == 1 {
			return "1 " + what
		}
		return strconv.Itoa(k) + " " + what + "s"
	}
	switch {
	case past == 0:
		return n(claims, "claim")
	case claims == 0:
		return n(past, "past claim") + " not yet freed"
	}
	return n(claims, "claim") + " and " + n(past, "past claim") + " not yet freed"
}
