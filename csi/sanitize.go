package csi

import (
	"bytes"
	"slices"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Stripped replaces every secret and mount flag in sanitized messages and
// errors.
const Stripped = "***stripped***"

// mountFlagsField is the one field that holds no csi_secret option but may
// still carry credentials (cifs "password=...", for example).
const mountFlagsField protoreflect.FullName = "csi.v1.VolumeCapability.MountVolume.mount_flags"

// isRedacted reports whether fd carries the csi_secret option or is
// VolumeCapability.MountVolume.mount_flags.
func isRedacted(fd protoreflect.FieldDescriptor) bool {
	if fd.FullName() == mountFlagsField {
		return true
	}
	opts, ok := fd.Options().(*descriptorpb.FieldOptions)
	if !ok || opts == nil {
		return false
	}
	secret, _ := proto.GetExtension(opts, csipb.E_CsiSecret).(bool)
	return secret
}

// StripSecrets returns a deep copy of m in which the value of every field
// marked csi_secret (map values, list elements and scalars alike, in nested
// messages too) and every VolumeCapability mount flag is replaced by
// Stripped, and unknown fields are dropped (they may be secrets of a newer
// spec). m itself is not modified. It returns nil for nil.
func StripSecrets(m proto.Message) proto.Message {
	if m == nil {
		return nil
	}
	c := proto.Clone(m)
	if c == nil {
		return nil
	}
	strip(c.ProtoReflect())
	return c
}

// Sanitize renders m for a log line: compact JSON of StripSecrets(m). It
// returns "null" for nil.
func Sanitize(m proto.Message) string {
	if m == nil || !m.ProtoReflect().IsValid() {
		return "null"
	}
	b, err := protojson.MarshalOptions{}.Marshal(StripSecrets(m))
	if err != nil {
		// protojson fails only on invalid UTF-8 or the like; never fall
		// back to printing the message itself.
		return "<unprintable " + string(m.ProtoReflect().Descriptor().FullName()) + ">"
	}
	return string(b)
}

func strip(m protoreflect.Message) {
	if !m.IsValid() {
		return
	}
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		switch {
		case isRedacted(fd):
			redact(m, fd)
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				m.Mutable(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
					strip(v.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := m.Mutable(fd).List()
				for i := range l.Len() {
					strip(l.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			strip(m.Mutable(fd).Message())
		}
		return true
	})
}

// redacted returns Stripped as a value of fd's kind, or false when the kind
// cannot hold it (the field is then cleared).
func redacted(fd protoreflect.FieldDescriptor) (protoreflect.Value, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(Stripped), true
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(Stripped)), true
	}
	return protoreflect.Value{}, false
}

func redact(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	switch {
	case fd.IsMap():
		v, ok := redacted(fd.MapValue())
		if !ok {
			m.Clear(fd)
			return
		}
		mp := m.Mutable(fd).Map()
		var keys []protoreflect.MapKey
		mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			keys = append(keys, k)
			return true
		})
		for _, k := range keys {
			mp.Set(k, v)
		}
	case fd.IsList():
		v, ok := redacted(fd)
		if !ok {
			m.Clear(fd)
			return
		}
		l := m.Mutable(fd).List()
		for i := range l.Len() {
			l.Set(i, v)
		}
	default:
		if v, ok := redacted(fd); ok {
			m.Set(fd, v)
		} else {
			m.Clear(fd)
		}
	}
}

// secretValues returns the non-empty string values of every redacted field
// of m (see StripSecrets), longest first.
func secretValues(m proto.Message) []string {
	if m == nil {
		return nil
	}
	var out []string
	collectSecrets(m.ProtoReflect(), &out)
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out)
}

func collectSecrets(m protoreflect.Message, out *[]string) {
	if !m.IsValid() {
		return
	}
	add := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
		switch fd.Kind() {
		case protoreflect.StringKind:
			if s := v.String(); s != "" {
				*out = append(*out, s)
			}
		case protoreflect.BytesKind:
			if b := v.Bytes(); len(b) > 0 {
				*out = append(*out, string(b))
			}
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		secret := isRedacted(fd)
		switch {
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				switch {
				case secret:
					add(fd.MapValue(), mv)
				case fd.MapValue().Message() != nil:
					collectSecrets(mv.Message(), out)
				}
				return true
			})
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch {
				case secret:
					add(fd, l.Get(i))
				case fd.Message() != nil:
					collectSecrets(l.Get(i).Message(), out)
				}
			}
		case secret:
			add(fd, v)
		case fd.Message() != nil:
			collectSecrets(v.Message(), out)
		}
		return true
	})
}

// scrubString replaces every occurrence of the secrets (longest first) in s
// with Stripped.
func scrubString(s string, secrets []string) string {
	for _, sec := range secrets {
		if strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, Stripped)
		}
	}
	return s
}

// containsAny reports whether b contains one of the secrets.
func containsAny(b []byte, secrets []string) bool {
	for _, sec := range secrets {
		if bytes.Contains(b, []byte(sec)) {
			return true
		}
	}
	return false
}
