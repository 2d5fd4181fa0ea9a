package cli

import (
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestClaimState_ShowsCondition(t *testing.T) {
	for _, tc := range []struct {
		c    runtime.Claim
		want string
	}{
		{runtime.Claim{State: runtime.ClaimPublished}, "published"},
		{runtime.Claim{State: runtime.ClaimReserved, Condition: runtime.ClaimRepairing, Repair: "target path"}, "reserved (repairing: target path)"},
		{runtime.Claim{State: runtime.ClaimStaged, Condition: runtime.ClaimDegraded, Repair: "boot ID changed"}, "staged (degraded: boot ID changed)"},
		{runtime.Claim{State: runtime.ClaimTaken, Condition: runtime.ClaimStalled}, "taken (stalled)"},
		{runtime.Claim{State: runtime.ClaimReserved, Condition: runtime.ClaimStalled, Repair: "target path"}, "reserved (stalled: target path)"},
	} {
		if got := claimState(tc.c); got != tc.want {
			t.Errorf("claimState(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}

func TestReadyText(t *testing.T) {
	for _, tc := range []struct {
		r    runtime.Readiness
		want string
	}{
		{runtime.Readiness{Status: runtime.ReadyOK}, "yes"},
		{runtime.Readiness{Status: runtime.ReadyStarting}, "no (starting)"},
		{runtime.Readiness{Status: runtime.ReadyStarting, Pending: []string{"a", "b"}}, "no (pending: a; b)"},
	} {
		if got := readyText(tc.r); got != tc.want {
			t.Errorf("readyText(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}
