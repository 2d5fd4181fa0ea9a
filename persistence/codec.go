package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Volume records are stored in a compact binary form, because start-up
// decodes every active volume and JSON costs several times more there (see
// BenchmarkDecodeVolume). The decoder also reads JSON (a value that starts
// with '{'), and the store writes JSON instead whenever the codec does not
// cover every field of the record types (see volumeCodecCovers), so a field
// added to records.go is never silently dropped.
//
// Layout: volumeFormatBinary, then the fields of Volume in declaration
// order. Strings and element counts are uvarint-length-prefixed, ints
// varints, bools one byte. Each struct element (Capability, MountOptions,
// Claim, Staging) and each time.Time (its MarshalBinary form) is a
// length-prefixed sub-record; a nil *MountOptions is an absent one (count
// 0), a present one has count 1. A record or sub-record that ends before
// its last field leaves the remaining fields zero and bytes after the
// known fields are skipped, so fields appended to the end of any of these
// types keep older records readable without a new format.
const volumeFormatBinary byte = 0x01

// volumeFormatBinarySealed is volumeFormatBinary with the values of
// Secrets sealed (see sealing.go). A build that predates it reads such a
// record as damaged JSON, never as secrets in clear.
const volumeFormatBinarySealed byte = 0x02

// volumeCodecShape is the shape (see recordShape) of the record types the
// binary codec encodes. If records.go changes, the store falls back to
// JSON until the codec and this string are updated together (the test
// TestVolumeCodec_CoversRecords prints the new shape).
const volumeCodecShape = "Volume{ID string; Plugin string; ExternalID string; " +
	"Capabilities []Capability{AccessMode string; AttachmentMode string}; " +
	"MountOptions *MountOptions{FSType string; MountFlags []string}; " +
	"Parameters map[string]string; Context map[string]string; Secrets map[string]string; " +
	"CapacityBytes int64; Created bool; ControllerPublished bool; PublishContext map[string]string; " +
	"Claims []Claim{Alloc string; Mode string; AccessMode string; AttachmentMode string; State string; " +
	"Usage string; TargetPath string; StagingPath string; LastError string; Attempts int; " +
	"CreatedAt time.Time; UpdatedAt time.Time; NodeID string; ControllerRequired bool; Repair string; " +
	"ReadOnly bool; MountFlagCount int; MountGroup string; SELinuxContext string}; " +
	"PastClaims []Claim; " +
	"Stagings []Staging{Usage string; Path string; Users []string; Staged bool; Mounted bool; Lost bool}; " +
	"Revision uint64; CreatedAt time.Time; UpdatedAt time.Time; " +
	"Expansion *Expansion{CapacityBytes int64; Controller bool; NodeCapable bool; Node bool; LastError string; Attempts int; NodeOffline bool}; " +
	"AccessibleTopology []map[string]string; NodeExpandPending int64; SecretsFrom string; Ephemeral string; " +
	"ClaimMountFlags map[string]string; MutableParameters map[string]string; Modifying map[string]string}"

// volumeCodecCovers reports whether the binary codec covers every field of
// Volume as compiled.
func volumeCodecCovers() bool {
	return recordShape(reflect.TypeFor[Volume]()) == volumeCodecShape
}

// recordShape describes a record type's fields, recursively for this
// package's structs (each described once).
func recordShape(t reflect.Type) string {
	var b strings.Builder
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		b.WriteString(t.String()[len("persistence."):])
		if seen[t] {
			return
		}
		seen[t] = true
		b.WriteString("{")
		for i := range t.NumField() {
			f := t.Field(i)
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(f.Name + " ")
			ft := f.Type
			prefix := ""
			for ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
				if ft.Kind() == reflect.Slice {
					prefix += "[]"
				} else {
					prefix += "*"
				}
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() {
				b.WriteString(prefix)
				walk(ft)
				continue
			}
			b.WriteString(f.Type.String())
		}
		b.WriteString("}")
	}
	walk(t)
	return b.String()
}

// appendVolume appends v's binary form to dst.
func appendVolume(dst []byte, v *Volume) []byte {
	dst = append(dst, volumeFormatBinary)
	dst = appendString(dst, v.ID)
	dst = appendString(dst, v.Plugin)
	dst = appendString(dst, v.ExternalID)
	dst = binary.AppendUvarint(dst, uint64(len(v.Capabilities)))
	for i := range v.Capabilities {
		c := &v.Capabilities[i]
		dst = appendSub(dst, func(dst []byte) []byte {
			dst = appendString(dst, c.AccessMode)
			return appendString(dst, c.AttachmentMode)
		})
	}
	if mo := v.MountOptions; mo == nil {
		dst = binary.AppendUvarint(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, 1)
		dst = appendSub(dst, func(dst []byte) []byte {
			dst = appendString(dst, mo.FSType)
			return appendStrings(dst, mo.MountFlags)
		})
	}
	dst = appendMap(dst, v.Parameters)
	dst = appendMap(dst, v.Context)
	dst = appendMap(dst, v.Secrets)
	dst = binary.AppendVarint(dst, v.CapacityBytes)
	dst = appendBool(dst, v.Created)
	dst = appendBool(dst, v.ControllerPublished)
	dst = appendMap(dst, v.PublishContext)
	dst = appendClaims(dst, v.Claims)
	dst = appendClaims(dst, v.PastClaims)
	dst = binary.AppendUvarint(dst, uint64(len(v.Stagings)))
	for i := range v.Stagings {
		st := &v.Stagings[i]
		dst = appendSub(dst, func(dst []byte) []byte {
			dst = appendString(dst, st.Usage)
			dst = appendString(dst, st.Path)
			dst = appendStrings(dst, st.Users)
			dst = appendBool(dst, st.Staged)
			dst = appendBool(dst, st.Mounted)
			return appendBool(dst, st.Lost)
		})
	}
	dst = binary.AppendUvarint(dst, v.Revision)
	dst = appendTime(dst, v.CreatedAt)
	dst = appendTime(dst, v.UpdatedAt)
	if x := v.Expansion; x == nil {
		dst = binary.AppendUvarint(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, 1)
		dst = appendSub(dst, func(dst []byte) []byte {
			dst = binary.AppendVarint(dst, x.CapacityBytes)
			dst = appendBool(dst, x.Controller)
			dst = appendBool(dst, x.NodeCapable)
			dst = appendBool(dst, x.Node)
			dst = appendString(dst, x.LastError)
			dst = binary.AppendVarint(dst, int64(x.Attempts))
			return appendBool(dst, x.NodeOffline)
		})
	}
	dst = binary.AppendUvarint(dst, uint64(len(v.AccessibleTopology)))
	for _, t := range v.AccessibleTopology {
		dst = appendMap(dst, t)
	}
	dst = binary.AppendVarint(dst, v.NodeExpandPending)
	dst = appendString(dst, v.SecretsFrom)
	dst = appendString(dst, v.Ephemeral)
	dst = appendMap(dst, v.ClaimMountFlags)
	dst = appendMap(dst, v.MutableParameters)
	return appendMap(dst, v.Modifying)
}

func appendClaims(dst []byte, cs []Claim) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(cs)))
	for i := range cs {
		c := &cs[i]
		dst = appendSub(dst, func(dst []byte) []byte {
			dst = appendString(dst, c.Alloc)
			dst = appendString(dst, c.Mode)
			dst = appendString(dst, c.AccessMode)
			dst = appendString(dst, c.AttachmentMode)
			dst = appendString(dst, c.State)
			dst = appendString(dst, c.Usage)
			dst = appendString(dst, c.TargetPath)
			dst = appendString(dst, c.StagingPath)
			dst = appendString(dst, c.LastError)
			dst = binary.AppendVarint(dst, int64(c.Attempts))
			dst = appendTime(dst, c.CreatedAt)
			dst = appendTime(dst, c.UpdatedAt)
			dst = appendString(dst, c.NodeID)
			dst = appendBool(dst, c.ControllerRequired)
			dst = appendString(dst, c.Repair)
			dst = appendBool(dst, c.ReadOnly)
			dst = binary.AppendVarint(dst, int64(c.MountFlagCount))
			dst = appendString(dst, c.MountGroup)
			return appendString(dst, c.SELinuxContext)
		})
	}
	return dst
}

// appendSub appends what enc appends, prefixed with its length.
func appendSub(dst []byte, enc func([]byte) []byte) []byte {
	start := len(dst)
	dst = enc(dst)
	n := len(dst) - start
	var hdr [binary.MaxVarintLen64]byte
	h := binary.PutUvarint(hdr[:], uint64(n))
	dst = append(dst, hdr[:h]...)
	copy(dst[start+h:], dst[start:start+n])
	copy(dst[start:], hdr[:h])
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendStrings(dst []byte, ss []string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ss)))
	for _, s := range ss {
		dst = appendString(dst, s)
	}
	return dst
}

func appendMap(dst []byte, m map[string]string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(m)))
	for k, v := range m {
		dst = appendString(dst, k)
		dst = appendString(dst, v)
	}
	return dst
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func appendTime(dst []byte, t time.Time) []byte {
	return appendSub(dst, func(dst []byte) []byte {
		if b, err := t.AppendBinary(dst); err == nil {
			return b
		}
		// An offset that is not a whole number of seconds, or a year
		// out of range: keep the instant in UTC if that can be written.
		if b, err := t.UTC().AppendBinary(dst); err == nil {
			return b
		}
		return dst // the zero time
	})
}

// errMalformed is wrapped by decode errors of a malformed binary record.
var errMalformed = errors.New("malformed binary volume record")

// volumeReader decodes a binary volume record, or one sub-record of it.
// Strings are substrings of one string copy of the record, so a record
// costs one copy however many strings it holds, and nothing points into
// the transaction's pages. At the clean end of its bytes every read
// returns the zero value (a field this record predates).
type volumeReader struct {
	s   string
	i   int
	err *error // shared by a record and its sub-records
}

func (r *volumeReader) ok() bool { return *r.err == nil && r.i < len(r.s) }

func (r *volumeReader) fail(what string) {
	if *r.err == nil {
		*r.err = fmt.Errorf("%w: bad %s", errMalformed, what)
	}
	r.i = len(r.s)
}

func (r *volumeReader) uvarint(what string) uint64 {
	if !r.ok() {
		return 0
	}
	var x uint64
	var shift uint
	for i := r.i; i < len(r.s) && shift < 64; i++ {
		c := r.s[i]
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			r.i = i + 1
			return x
		}
		shift += 7
	}
	r.fail(what)
	return 0
}

func (r *volumeReader) varint(what string) int64 {
	u := r.uvarint(what)
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

// count reads a length or element count, bounded by the bytes left (every
// element takes at least one byte), so damage cannot make it allocate much.
func (r *volumeReader) count(what string) int {
	n := r.uvarint(what)
	if n > uint64(len(r.s)-r.i) {
		r.fail(what)
		return 0
	}
	return int(n)
}

func (r *volumeReader) string(what string) string {
	n := r.count(what)
	s := r.s[r.i : r.i+n]
	r.i += n
	return s
}

// sub returns a reader over the next length-prefixed sub-record and moves
// past it.
func (r *volumeReader) sub(what string) volumeReader {
	s := r.string(what)
	return volumeReader{s: s, err: r.err}
}

func (r *volumeReader) strings(what string) []string {
	n := r.count(what)
	if n == 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = r.string(what)
	}
	return out
}

func (r *volumeReader) stringMap(what string) map[string]string {
	n := r.count(what)
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k := r.string(what)
		m[k] = r.string(what)
	}
	return m
}

func (r *volumeReader) bool(what string) bool {
	if !r.ok() {
		return false
	}
	c := r.s[r.i]
	if c > 1 {
		r.fail(what)
		return false
	}
	r.i++
	return c == 1
}

func (r *volumeReader) time(what string) time.Time {
	raw := r.string(what)
	var t time.Time
	if raw != "" {
		if err := t.UnmarshalBinary([]byte(raw)); err != nil {
			r.fail(what)
		}
	}
	return t
}

func (r *volumeReader) claims(what string) []Claim {
	n := r.count(what)
	if n == 0 {
		return nil
	}
	out := make([]Claim, n)
	for i := range out {
		c, e := &out[i], r.sub(what)
		// Field names as constants: building them would allocate.
		c.Alloc = e.string("claim alloc")
		c.Mode = e.string("claim mode")
		c.AccessMode = e.string("claim access_mode")
		c.AttachmentMode = e.string("claim attachment_mode")
		c.State = e.string("claim state")
		c.Usage = e.string("claim usage")
		c.TargetPath = e.string("claim target_path")
		c.StagingPath = e.string("claim staging_path")
		c.LastError = e.string("claim last_error")
		c.Attempts = int(e.varint("claim attempts"))
		c.CreatedAt = e.time("claim created_at")
		c.UpdatedAt = e.time("claim updated_at")
		c.NodeID = e.string("claim node_id")
		c.ControllerRequired = e.bool("claim controller_required")
		c.Repair = e.string("claim repair")
		c.ReadOnly = e.bool("claim read_only")
		c.MountFlagCount = int(e.varint("claim mount_flag_count"))
		c.MountGroup = e.string("claim mount_group")
		c.SELinuxContext = e.string("claim selinux_context")
	}
	return out
}

// decodeVolumeBinary decodes a record written by appendVolume into v. data
// must start with volumeFormatBinary.
func decodeVolumeBinary(data []byte, v *Volume) error {
	var err error
	r := volumeReader{s: string(data), i: 1, err: &err}
	*v = Volume{}
	v.ID = r.string("id")
	v.Plugin = r.string("plugin")
	v.ExternalID = r.string("external_id")
	if n := r.count("capabilities"); n > 0 {
		v.Capabilities = make([]Capability, n)
		for i := range v.Capabilities {
			e := r.sub("capabilities")
			v.Capabilities[i].AccessMode = e.string("capability access_mode")
			v.Capabilities[i].AttachmentMode = e.string("capability attachment_mode")
		}
	}
	if n := r.count("mount_options"); n == 1 {
		e := r.sub("mount_options")
		v.MountOptions = &MountOptions{FSType: e.string("fs_type"), MountFlags: e.strings("mount_flags")}
	} else if n > 1 {
		r.fail("mount_options")
	}
	v.Parameters = r.stringMap("parameters")
	v.Context = r.stringMap("context")
	v.Secrets = r.stringMap("secrets")
	v.CapacityBytes = r.varint("capacity_bytes")
	v.Created = r.bool("created")
	v.ControllerPublished = r.bool("controller_published")
	v.PublishContext = r.stringMap("publish_context")
	v.Claims = r.claims("claim")
	v.PastClaims = r.claims("past claim")
	if n := r.count("stagings"); n > 0 {
		v.Stagings = make([]Staging, n)
		for i := range v.Stagings {
			st, e := &v.Stagings[i], r.sub("stagings")
			st.Usage = e.string("staging usage")
			st.Path = e.string("staging path")
			st.Users = e.strings("staging users")
			st.Staged = e.bool("staging staged")
			st.Mounted = e.bool("staging mounted")
			st.Lost = e.bool("staging lost")
		}
	}
	v.Revision = r.uvarint("revision")
	v.CreatedAt = r.time("created_at")
	v.UpdatedAt = r.time("updated_at")
	if n := r.count("expansion"); n == 1 {
		e := r.sub("expansion")
		v.Expansion = &Expansion{
			CapacityBytes: e.varint("expansion capacity_bytes"),
			Controller:    e.bool("expansion controller"),
			NodeCapable:   e.bool("expansion node_capable"),
			Node:          e.bool("expansion node"),
			LastError:     e.string("expansion last_error"),
			Attempts:      int(e.varint("expansion attempts")),
			NodeOffline:   e.bool("expansion node_offline"),
		}
	} else if n > 1 {
		r.fail("expansion")
	}
	if n := r.count("accessible_topology"); n > 0 {
		v.AccessibleTopology = make([]map[string]string, n)
		for i := range v.AccessibleTopology {
			v.AccessibleTopology[i] = r.stringMap("accessible_topology")
		}
	}
	v.NodeExpandPending = r.varint("node_expand_pending")
	v.SecretsFrom = r.string("secrets_from")
	v.Ephemeral = r.string("ephemeral")
	v.ClaimMountFlags = r.stringMap("claim_mount_flags")
	v.MutableParameters = r.stringMap("mutable_parameters")
	v.Modifying = r.stringMap("modifying")
	return err
}
