package claim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

var now = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func fsCap(am csi.AccessMode) csi.VolumeCapability {
	return csi.VolumeCapability{AccessMode: am, AttachmentMode: csi.AttachmentModeFileSystem}
}

func vol(caps ...csi.VolumeCapability) *persistence.Volume {
	v := &persistence.Volume{ID: "vol", Plugin: "p", ExternalID: "ext",
		MountOptions: &persistence.MountOptions{FSType: "xfs", MountFlags: []string{"ro"}},
		Secrets:      map[string]string{"k": "secret"}}
	for _, c := range caps {
		v.Capabilities = append(v.Capabilities, persistence.Capability{AccessMode: c.AccessMode.String(), AttachmentMode: c.AttachmentMode.String()})
	}
	return v
}

func TestUsage_Paths(t *testing.T) {
	c := fsCap(csi.AccessModeSingleNodeWriter)
	if u := Usage(ModeWrite, c); u != "rw-file-system-single-node-writer" {
		t.Errorf("Usage = %q", u)
	}
	if u := Usage(ModeRead, csi.VolumeCapability{AccessMode: csi.AccessModeMultiNodeReaderOnly, AttachmentMode: csi.AttachmentModeBlockDevice}); u != "ro-block-device-multi-node-reader-only" {
		t.Errorf("Usage = %q", u)
	}
	if p := StagingPath("/d", "p", "v", "u"); p != "/d/volumes/p/staging/v/u" {
		t.Errorf("StagingPath = %q", p)
	}
	if p := TargetPath("/d", "p", "a", "v", "u"); p != "/d/volumes/p/per-alloc/a/v/u" {
		t.Errorf("TargetPath = %q", p)
	}
}

func TestCheckName_Cases(t *testing.T) {
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"vol-1_a.b", true}, {"", false}, {".", false}, {"..", false}, {"a/b", false},
		{`a\b`, false}, {"a\x00b", false}, {"a\nb", false}, {strings.Repeat("x", MaxNameLen), true},
		{strings.Repeat("x", MaxNameLen+1), false},
	} {
		err := CheckName("volume", tt.in)
		if (err == nil) != tt.ok || (err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "volume"))) {
			t.Errorf("CheckName(%q) = %v, want ok=%v and an error naming the field", tt.in, err, tt.ok)
		}
	}
}

func TestAdmit_Cases(t *testing.T) {
	snw := fsCap(csi.AccessModeSingleNodeWriter)
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	claimOf := func(alloc string, mode Mode, c csi.VolumeCapability, state string) persistence.Claim {
		return persistence.Claim{Alloc: alloc, Mode: string(mode), AccessMode: c.AccessMode.String(), AttachmentMode: c.AttachmentMode.String(), State: state}
	}
	tests := []struct {
		name  string
		v     func() *persistence.Volume
		req   Request
		index int
		want  error
	}{
		{"first claim", func() *persistence.Volume { return vol(snw) },
			Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, -1, nil},
		{"repeat is idempotent", func() *persistence.Volume {
			v := vol(snw)
			v.Claims = []persistence.Claim{claimOf("a", ModeWrite, snw, StateStaged)}
			return v
		}, Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, 0, nil},
		{"same alloc other mode", func() *persistence.Volume {
			v := vol(snw)
			v.Claims = []persistence.Claim{claimOf("a", ModeWrite, snw, StatePublished)}
			return v
		}, Request{Alloc: "a", Mode: ModeRead, Capability: snw}, -1, ErrConflict},
		{"capability the volume lacks", func() *persistence.Volume { return vol(snw) },
			Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw}, -1, ErrInvalid},
		{"other capability held", func() *persistence.Volume {
			v := vol(snw, mnmw)
			v.Claims = []persistence.Claim{claimOf("a", ModeWrite, mnmw, StatePublished)}
			return v
		}, Request{Alloc: "b", Mode: ModeWrite, Capability: snw}, -1, ErrConflict},
		{"released writer still published holds", func() *persistence.Volume {
			v := vol(snw)
			v.PastClaims = []persistence.Claim{claimOf("a", ModeWrite, snw, StateTaken)}
			return v
		}, Request{Alloc: "b", Mode: ModeWrite, Capability: snw}, -1, ErrClaimLimit},
		{"detached past claim does not hold", func() *persistence.Volume {
			v := vol(snw)
			v.PastClaims = []persistence.Claim{claimOf("a", ModeWrite, snw, StateNodeDetached)}
			return v
		}, Request{Alloc: "b", Mode: ModeWrite, Capability: snw}, -1, nil},
		{"same alloc being released", func() *persistence.Volume {
			v := vol(snw)
			v.PastClaims = []persistence.Claim{claimOf("a", ModeWrite, snw, StateControllerDetached)}
			return v
		}, Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, -1, ErrInUse},
		{"write on reader-only", func() *persistence.Volume { return vol(fsCap(csi.AccessModeMultiNodeReaderOnly)) },
			Request{Alloc: "a", Mode: ModeWrite, Capability: fsCap(csi.AccessModeMultiNodeReaderOnly)}, -1, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i, err := Admit(tt.v(), tt.req)
			if i != tt.index || (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Errorf("Admit = %d, %v; want %d, %v", i, err, tt.index, tt.want)
			}
		})
	}
}

// publishAll runs NextPublish/ApplyPublish to the end and returns the RPCs.
func publishAll(t *testing.T, v *persistence.Volume, alloc string) []Method {
	t.Helper()
	var got []Method
	for range 10 {
		s, ok := NextPublish(v, alloc)
		if !ok {
			return got
		}
		got = append(got, s.Method)
		ApplyPublish(v, s, Result{PublishContext: map[string]string{"dev": "/dev/x"}}, now)
	}
	t.Fatalf("publish did not finish: %v", got)
	return nil
}

// releaseAll runs AdvanceRelease/ApplyRelease to the end and returns the RPCs.
func releaseAll(t *testing.T, v *persistence.Volume, alloc string) []Method {
	t.Helper()
	var got []Method
	for range 10 {
		s, run, _ := AdvanceRelease(v, alloc, now)
		if !run {
			if FindClaim(v.PastClaims, alloc) >= 0 {
				t.Fatalf("AdvanceRelease stopped with the past claim still there")
			}
			return got
		}
		got = append(got, s.Method)
		ApplyRelease(v, s, now)
	}
	t.Fatalf("release did not finish: %v", got)
	return nil
}

func TestSteps_FullLifecycle(t *testing.T) {
	snw := fsCap(csi.AccessModeSingleNodeWriter)
	v := vol(snw)
	f := Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}
	c := Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, f, "/d", now)
	if c.State != StateReserved || c.NodeID != "n1" || !c.ControllerRequired || c.StagingPath == "" {
		t.Fatalf("reserved %+v", c)
	}
	if len(v.Stagings) != 1 || !slices.Equal(v.Stagings[0].Users, []string{"a"}) || v.Stagings[0].Staged {
		t.Fatalf("usage not counted at reserve: %+v", v.Stagings)
	}
	s, _ := NextPublish(v, "a")
	if s.Method != ControllerPublish || s.NodeID != "n1" || s.Capability.MountOptions == nil || s.Secrets["k"] != "secret" {
		t.Errorf("first step %#v", s)
	}
	if strings.Contains(s.String()+s.GoString(), "secret") {
		t.Errorf("step prints a secret: %s", s.String())
	}
	if got := publishAll(t, v, "a"); !slices.Equal(got, []Method{ControllerPublish, NodeStage, NodePublish}) {
		t.Errorf("publish steps %v", got)
	}
	if v.Claims[0].State != StatePublished || !v.ControllerPublished || v.PublishContext["dev"] != "/dev/x" || !v.Stagings[0].Staged {
		t.Fatalf("after publish: %+v", v)
	}
	if _, ok := Retire(v, "a", "", now); !ok {
		t.Fatal("retire")
	}
	if got := releaseAll(t, v, "a"); !slices.Equal(got, []Method{NodeUnpublish, NodeUnstage, ControllerUnpublish}) {
		t.Errorf("release steps %v", got)
	}
	if len(v.Stagings) != 0 || v.ControllerPublished || v.PublishContext != nil || Unfinished(v) {
		t.Errorf("after release: %+v", v)
	}
}

func TestSteps_SharedStagingAndController(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	f := Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}
	Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	publishAll(t, v, "a")
	Reserve(v, Request{Alloc: "b", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	if got := publishAll(t, v, "b"); !slices.Equal(got, []Method{NodePublish}) {
		t.Errorf("second claim on a staged, controller-published volume ran %v", got)
	}
	if !slices.Equal(v.Stagings[0].Users, []string{"a", "b"}) {
		t.Errorf("users %v", v.Stagings[0].Users)
	}
	Retire(v, "a", "", now)
	if got := releaseAll(t, v, "a"); !slices.Equal(got, []Method{NodeUnpublish}) {
		t.Errorf("release while another claim uses the staging ran %v", got)
	}
	if !v.Stagings[0].Staged || !v.ControllerPublished {
		t.Errorf("shared staging or controller publish torn down: %+v", v)
	}
	Retire(v, "b", "", now)
	if got := releaseAll(t, v, "b"); !slices.Equal(got, []Method{NodeUnpublish, NodeUnstage, ControllerUnpublish}) {
		t.Errorf("last release ran %v", got)
	}
}

// A claim that arrives while the last user's NodeUnstageVolume is in
// flight joins a staging that is about to be gone: it must stage again.
func TestSteps_ClaimDuringUnstageStagesAgain(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	f := Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}
	Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	publishAll(t, v, "a")
	Retire(v, "a", "", now)
	s, _, _ := AdvanceRelease(v, "a", now)
	ApplyRelease(v, s, now) // NodeUnpublish
	unstage, run, changed := AdvanceRelease(v, "a", now)
	if !run || unstage.Method != NodeUnstage {
		t.Fatalf("next release step %v (run %v), want NodeUnstage", unstage.Method, run)
	}
	if !changed || v.Stagings[0].Staged {
		t.Fatalf("staging still recorded as staged while its unstage runs: %+v", v.Stagings)
	}
	// b is reserved while the unstage is in flight, then the unstage ends.
	Reserve(v, Request{Alloc: "b", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	ApplyRelease(v, unstage, now)
	if got := releaseAll(t, v, "a"); len(got) != 0 {
		t.Errorf("a's release ran %v after b joined, want nothing more (b needs the attachment)", got)
	}
	if got := publishAll(t, v, "b"); !slices.Equal(got, []Method{NodeStage, NodePublish}) {
		t.Errorf("claim that joined during the unstage ran %v, want NodeStage then NodePublish", got)
	}
	// An unstage that fails (outcome unknown) and is then overtaken by a
	// new user: the new user stages again all the same.
	Retire(v, "b", "", now)
	s, _, _ = AdvanceRelease(v, "b", now)
	ApplyRelease(v, s, now) // NodeUnpublish
	if s, _, _ = AdvanceRelease(v, "b", now); s.Method != NodeUnstage {
		t.Fatalf("step %v, want NodeUnstage", s.Method)
	}
	Reserve(v, Request{Alloc: "c", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	if got := releaseAll(t, v, "b"); len(got) != 0 {
		t.Errorf("b's release ran %v after c joined, want nothing more", got)
	}
	if got := publishAll(t, v, "c"); !slices.Equal(got, []Method{NodeStage, NodePublish}) {
		t.Errorf("claim that joined after an uncertain unstage ran %v, want NodeStage then NodePublish", got)
	}
}

// A ControllerUnpublishVolume that may have taken effect (a lost answer,
// a crash) leaves the attachment uncertain: the next claim publishes it
// again, and the released claim does not unpublish it from under it.
func TestSteps_ClaimAfterUncertainControllerUnpublishPublishesAgain(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	f := Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}
	Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	publishAll(t, v, "a")
	Retire(v, "a", "", now)
	var s Step
	for range 3 {
		var run bool
		if s, run, _ = AdvanceRelease(v, "a", now); !run {
			t.Fatal("release finished before ControllerUnpublish")
		}
		if s.Method == ControllerUnpublish {
			break
		}
		ApplyRelease(v, s, now)
	}
	if s.Method != ControllerUnpublish || v.ControllerPublished || v.PublishContext != nil {
		t.Fatalf("at %v the record still says controller-published (%v, %v)", s.Method, v.ControllerPublished, v.PublishContext)
	}
	// The unpublish's answer is lost; it is retried as it was.
	if again, run, _ := AdvanceRelease(v, "a", now); !run || again.Method != ControllerUnpublish {
		t.Errorf("retry after a failed ControllerUnpublish: %v (run %v), want ControllerUnpublish again", again.Method, run)
	}
	// Before the retry, b claims: it publishes again, and a's teardown
	// leaves the attachment to b.
	Reserve(v, Request{Alloc: "b", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	if got := publishAll(t, v, "b"); !slices.Equal(got, []Method{ControllerPublish, NodeStage, NodePublish}) {
		t.Errorf("claim after an uncertain ControllerUnpublish ran %v", got)
	}
	if got := releaseAll(t, v, "a"); len(got) != 0 {
		t.Errorf("a's release ran %v while b holds the attachment", got)
	}
	if !v.ControllerPublished || v.PublishContext["dev"] != "/dev/x" {
		t.Errorf("b's attachment lost: %+v", v)
	}
	// Not controller-required, yet published (another claim's facts): the
	// uncertain unpublish is still retried until it succeeds.
	w := vol(mnmw)
	Reserve(w, Request{Alloc: "a", Mode: ModeWrite, Capability: mnmw}, Facts{NodeID: "n1", StageUnstage: true}, "/d", now)
	publishAll(t, w, "a")
	w.ControllerPublished = true
	Retire(w, "a", "", now)
	for range 3 {
		if s, _, _ = AdvanceRelease(w, "a", now); s.Method == ControllerUnpublish {
			break
		}
		ApplyRelease(w, s, now)
	}
	if again, run, _ := AdvanceRelease(w, "a", now); !run || again.Method != ControllerUnpublish {
		t.Errorf("retry of an uncertain ControllerUnpublish of a claim without the controller fact: %v (run %v)", again.Method, run)
	}
}

func TestSteps_NoStagingNoController(t *testing.T) {
	snw := fsCap(csi.AccessModeSingleNodeWriter)
	v := vol(snw)
	c := Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, Facts{NodeID: "n1"}, "/d", now)
	if c.StagingPath != "" || len(v.Stagings) != 0 {
		t.Errorf("staging without STAGE_UNSTAGE: %+v", v)
	}
	if got := publishAll(t, v, "a"); !slices.Equal(got, []Method{NodePublish}) {
		t.Errorf("publish ran %v", got)
	}
	Retire(v, "a", "", now)
	if got := releaseAll(t, v, "a"); !slices.Equal(got, []Method{NodeUnpublish}) {
		t.Errorf("release ran %v", got)
	}
}

func TestSteps_FailedStageStillTornDown(t *testing.T) {
	// A claim that failed while staging (maybe staged, maybe not) is
	// unpublished, unstaged and controller-unpublished anyway.
	snw := fsCap(csi.AccessModeSingleNodeWriter)
	v := vol(snw)
	Reserve(v, Request{Alloc: "a", Mode: ModeWrite, Capability: snw}, Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}, "/d", now)
	if s, _ := NextPublish(v, "a"); s.Method != ControllerPublish {
		t.Fatalf("first step %s", s.Method)
	}
	if _, ok := Retire(v, "a", "boom", now); !ok || v.PastClaims[0].LastError != "boom" {
		t.Fatalf("retire: %+v", v.PastClaims)
	}
	if got := releaseAll(t, v, "a"); !slices.Equal(got, []Method{NodeUnpublish, NodeUnstage, ControllerUnpublish}) {
		t.Errorf("teardown of a failed claim ran %v", got)
	}
}

// The volume actor changes a CloneVolume of its record at every step and
// keeps the record it had: no plan function may change a record it was not
// given, through the parts a clone shares.
func TestCloneVolume_PlansLeaveTheOriginal(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	v.Context = map[string]string{"c": "1"}
	v.Parameters = map[string]string{"p": "1"}
	f := Facts{NodeID: "n1", ControllerRequired: true, StageUnstage: true}
	// Each step changes a clone, as the actor does; every earlier record
	// must read as it did when it was made.
	var records []*persistence.Volume
	var frozen []string
	step := func(change func(*persistence.Volume)) {
		t.Helper()
		c := CloneVolume(v)
		change(c)
		records, frozen = append(records, v), append(frozen, fmt.Sprintf("%#v", *v)+dump(v))
		v = c
		for k, r := range records {
			if got := fmt.Sprintf("%#v", *r) + dump(r); got != frozen[k] {
				t.Fatalf("record %d changed after it was cloned:\n%s\nwant\n%s", k, got, frozen[k])
			}
		}
	}
	for _, alloc := range []string{"w", "r"} {
		mode := ModeWrite
		if alloc == "r" {
			mode = ModeRead
		}
		step(func(c *persistence.Volume) {
			Reserve(c, Request{Alloc: alloc, Mode: mode, Capability: mnmw}, f, "/d", now)
		})
		for {
			s, ok := NextPublish(v, alloc)
			if !ok {
				break
			}
			step(func(c *persistence.Volume) {
				ApplyPublish(c, s, Result{PublishContext: map[string]string{"dev": "/dev/" + alloc}}, now)
			})
		}
	}
	for _, alloc := range []string{"w", "r"} {
		step(func(c *persistence.Volume) { Retire(c, alloc, "", now) })
		for {
			var s Step
			var run bool
			step(func(c *persistence.Volume) { s, run, _ = AdvanceRelease(c, alloc, now) })
			if !run {
				break
			}
			step(func(c *persistence.Volume) { ApplyRelease(c, s, now) })
		}
	}
	if len(v.Claims)+len(v.PastClaims)+len(v.Stagings) != 0 || v.PublishContext != nil {
		t.Errorf("after both lifecycles: %+v", v)
	}
}

// dump shows what %#v leaves behind pointers and inside slices of structs.
func dump(v *persistence.Volume) string {
	s := fmt.Sprintf("%v %v %v %v %v %v", v.Capabilities, v.Parameters, v.Context, v.Secrets, v.PublishContext, v.PastClaims)
	if v.MountOptions != nil {
		s += fmt.Sprintf(" %#v", *v.MountOptions)
	}
	for _, st := range v.Stagings {
		s += fmt.Sprintf(" %#v", st)
	}
	for _, c := range v.Claims {
		s += fmt.Sprintf(" %#v", c)
	}
	return s
}

func TestReserve_OneStagingPerVolume(t *testing.T) {
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	v := vol(mnmw)
	f := Facts{NodeID: "n1", StageUnstage: true}
	w := Reserve(v, Request{Alloc: "w", Mode: ModeWrite, Capability: mnmw}, f, "/d", now)
	r := Reserve(v, Request{Alloc: "r", Mode: ModeRead, Capability: mnmw}, f, "/d", now)
	if w.Usage == r.Usage || w.TargetPath == r.TargetPath {
		t.Fatalf("read and write claims share a usage or target: %+v %+v", w, r)
	}
	if r.StagingPath != w.StagingPath || len(v.Stagings) != 1 || !slices.Equal(v.Stagings[0].Users, []string{"w", "r"}) {
		t.Fatalf("a second usage made a second staging (the CSI spec allows one per volume): %+v", v.Stagings)
	}
	if got := publishAll(t, v, "w"); !slices.Equal(got, []Method{NodeStage, NodePublish}) {
		t.Errorf("writer ran %v", got)
	}
	if got := publishAll(t, v, "r"); !slices.Equal(got, []Method{NodePublish}) {
		t.Errorf("reader ran %v", got)
	}
}

func TestAdmit_Messages(t *testing.T) {
	snw := fsCap(csi.AccessModeSingleNodeWriter)
	snro := fsCap(csi.AccessModeSingleNodeReaderOnly)
	mnsw := fsCap(csi.AccessModeMultiNodeSingleWriter)
	held := func(c csi.VolumeCapability, claims ...persistence.Claim) *persistence.Volume {
		v := vol(c)
		v.ID = "data"
		v.Claims = claims
		return v
	}
	claimOf := func(alloc string, mode Mode, c csi.VolumeCapability) persistence.Claim {
		return persistence.Claim{Alloc: alloc, Mode: string(mode), AccessMode: c.AccessMode.String(),
			AttachmentMode: c.AttachmentMode.String(), State: StatePublished}
	}
	tests := []struct {
		name string
		v    *persistence.Volume
		req  Request
		is   []error
		want string
	}{
		{"single writer", held(snw, claimOf("web1", ModeWrite, snw)), Request{Alloc: "web2", Mode: ModeRead, Capability: snw},
			[]error{ErrClaimLimit, ErrConflict},
			`access mode single-node-writer allows one claim and alloc "web1" holds it`},
		{"single reader", held(snro, claimOf("r1", ModeRead, snro)), Request{Alloc: "r2", Mode: ModeRead, Capability: snro},
			[]error{ErrClaimLimit, ErrConflict},
			`access mode single-node-reader-only allows one reader and alloc "r1" holds it`},
		{"one writer of many", held(mnsw, claimOf("r1", ModeRead, mnsw), claimOf("w1", ModeWrite, mnsw)), Request{Alloc: "w2", Mode: ModeWrite, Capability: mnsw},
			[]error{ErrClaimLimit, ErrConflict},
			`access mode multi-node-single-writer allows one writer and alloc "w1" holds it`},
		{"other mode held", held(snw, claimOf("web1", ModeWrite, snw)), Request{Alloc: "web1", Mode: ModeRead, Capability: snw},
			[]error{ErrConflict},
			`alloc "web1" already holds a write claim with single-node-writer/file-system on volume "data"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Admit(tt.v, tt.req)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Admit error = %v, want %q", err, tt.want)
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
		})
	}
	if errors.Is(ErrConflict, ErrClaimLimit) || errors.Is(ErrInUse, ErrClaimLimit) {
		t.Errorf("ErrClaimLimit matches a more general error")
	}
	if ErrInUse.Error() != "in use" || ErrClaimLimit.Error() != "claim limit reached" || ErrConflict.Error() != "conflict" {
		t.Errorf("sentinel texts: %q, %q, %q", ErrInUse, ErrClaimLimit, ErrConflict)
	}
}

// TestDistrustTeardowns_ALostUnstageIsRedone plays the crash of issue
// "claims hang after random crashes": a release's NodeUnpublishVolume and
// NodeUnstageVolume ran, but their deferred writes were lost with the
// agent. Loaded again, the record says staged; a new claim must stage
// (and publish to the host) again rather than trust it.
func TestDistrustTeardowns_ALostUnstageIsRedone(t *testing.T) {
	now := time.Now()
	v := &persistence.Volume{
		ID: "v", ControllerPublished: true, PublishContext: map[string]string{"k": "v"},
		PastClaims: []persistence.Claim{{Alloc: "a", State: StateTaken, StagingPath: "/s", TargetPath: "/t/a", ControllerRequired: true}},
		Stagings:   []persistence.Staging{{Path: "/s", Usage: "u", Users: []string{"a"}, Staged: true}},
	}
	if !DistrustTeardowns(v) {
		t.Fatal("DistrustTeardowns changed nothing")
	}
	if v.Stagings[0].Staged || v.ControllerPublished || v.PublishContext != nil || !v.PastClaims[0].ControllerRequired {
		t.Fatalf("after DistrustTeardowns: staging %+v, controller published %t, context %v", v.Stagings[0], v.ControllerPublished, v.PublishContext)
	}
	// A new claim joins the staging: it publishes and stages again.
	v.Claims = append(v.Claims, persistence.Claim{Alloc: "b", State: StateReserved, StagingPath: "/s", TargetPath: "/t/b", ControllerRequired: true})
	addUser(v, "u", "/s", "b")
	var got []string
	for {
		s, ok := NextPublish(v, "b")
		if !ok {
			break
		}
		got = append(got, s.Method.String())
		ApplyPublish(v, s, Result{}, now)
	}
	want := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	if !slices.Equal(got, want) {
		t.Fatalf("new claim's RPCs %v, want %v", got, want)
	}
	// The past claim's teardown leaves them to b.
	var rel []string
	for {
		s, run, _ := AdvanceRelease(v, "a", now)
		if !run {
			break
		}
		rel = append(rel, s.Method.String())
		ApplyRelease(v, s, now)
	}
	if !slices.Equal(rel, []string{"NodeUnpublishVolume"}) || !v.ControllerPublished || !v.Stagings[0].Staged {
		t.Fatalf("release RPCs %v; controller published %t, staging %+v", rel, v.ControllerPublished, v.Stagings[0])
	}
}

// TestDistrustTeardowns_CurrentClaimsHoldWhatTheyUse: what a current claim
// uses was never torn down after the loaded record (claims come and go
// only by synced writes), so it stays trusted.
func TestDistrustTeardowns_CurrentClaimsHoldWhatTheyUse(t *testing.T) {
	v := &persistence.Volume{
		ID: "v", ControllerPublished: true,
		Claims:     []persistence.Claim{{Alloc: "b", State: StatePublished, StagingPath: "/s", ControllerRequired: true}},
		PastClaims: []persistence.Claim{{Alloc: "a", State: StateTaken, StagingPath: "/s", ControllerRequired: true}},
		Stagings:   []persistence.Staging{{Path: "/s", Users: []string{"a", "b"}, Staged: true}},
	}
	if DistrustTeardowns(v) || !v.Stagings[0].Staged || !v.ControllerPublished {
		t.Fatalf("a staging and attachment held by a current claim were distrusted: %+v, %t", v.Stagings[0], v.ControllerPublished)
	}
	v.PastClaims[0].State = StateControllerDetached
	v.Claims = nil
	if DistrustTeardowns(v) {
		t.Fatal("a past claim done with the node and the controller made the record change")
	}
}

// TestUnstaged_FailedPreconditionStagesAgain: NodePublishVolume answered
// FailedPrecondition for a staging the record believes in; the claim
// stages again instead of retrying the publish forever.
func TestUnstaged_FailedPreconditionStagesAgain(t *testing.T) {
	v := &persistence.Volume{
		ID:       "v",
		Claims:   []persistence.Claim{{Alloc: "b", State: StateStaged, StagingPath: "/s"}, {Alloc: "c", State: StateReserved}},
		Stagings: []persistence.Staging{{Path: "/s", Users: []string{"b"}, Staged: true}},
	}
	RecordFailure(v.Claims, "b", "not staged", time.Now())
	Unstaged(v, "b")
	s, _ := NextPublish(v, "b")
	if s.Method != NodeStage {
		t.Fatalf("next step %v, want NodeStageVolume", s.Method)
	}
	ApplyPublish(v, s, Result{}, time.Now())
	if c := v.Claims[0]; c.State != StateStaged || c.Attempts != 1 || c.LastError != "not staged" || !v.Stagings[0].Staged {
		t.Fatalf("after staging again: %+v, staging %+v; want staged, the failure kept", c, v.Stagings[0])
	}
	if s, _ := NextPublish(v, "b"); s.Method != NodePublish {
		t.Fatalf("next step %v, want NodePublishVolume", s.Method)
	}
	Unstaged(v, "c") // no staging: left as it is
	if v.Claims[1].State != StateReserved {
		t.Fatalf("claim without staging: %s", v.Claims[1].State)
	}
}
