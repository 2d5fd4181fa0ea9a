package cli

import (
	"errors"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestUsageFromField_Cases(t *testing.T) {
	other := errors.New("boom")
	for _, tc := range []struct {
		name  string
		err   error
		names flagNames
		want  string // "" for the error unchanged
	}{
		{"nil", nil, volumeFlagNames, ""},
		{"not a field error", other, volumeFlagNames, ""},
		{"plain field", &runtime.FieldError{Field: "plugin", Msg: "must not be empty"}, volumeFlagNames, "-plugin: must not be empty"},
		{"indexed field", &runtime.FieldError{Field: "capabilities[2].access_mode", Msg: "bad"}, volumeFlagNames, "-capability #3: bad"},
		{"indexed list itself", &runtime.FieldError{Field: "capabilities[0]", Msg: "dup"}, volumeFlagNames, "-capability #1: dup"},
		{"nested key wins", &runtime.FieldError{Field: "mount_options.fs_type", Msg: "bad"}, volumeFlagNames, "-fs-type: bad"},
		{"parent key", &runtime.FieldError{Field: "mount_options", Msg: "file-system only"}, volumeFlagNames, "-fs-type/-mount-flag: file-system only"},
		{"no number for alternatives", &runtime.FieldError{Field: "mount_options.mount_flags[1]", Msg: "empty"}, volumeFlagNames, "-mount-flag #2: empty"},
		{"map key below", &runtime.FieldError{Field: "parameters.tier", Msg: "NUL"}, volumeFlagNames, "-parameter: NUL"},
		{"positional", &runtime.FieldError{Field: "command[0]", Msg: "must not be empty"}, allocFlagNames, "COMMAND: must not be empty"},
		{"unknown field kept", &runtime.FieldError{Field: "weird[x", Msg: "odd"}, volumeFlagNames, "weird[x: odd"},
		{"no field", &runtime.FieldError{Msg: "odd"}, volumeFlagNames, "odd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := usageFromField(tc.err, tc.names)
			if tc.want == "" {
				if got != tc.err {
					t.Errorf("usageFromField(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			var ue *usageError
			if !errors.As(got, &ue) || got.Error() != tc.want {
				t.Errorf("usageFromField = %#v (%v), want usage error %q", got, got, tc.want)
			}
		})
	}
}
