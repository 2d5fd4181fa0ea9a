package csi_test

import (
	"slices"
	"testing"

	"github.com/csiactor/csiactor/csi"
)

func TestCapabilities_Names(t *testing.T) {
	if got := (csi.PluginCapabilities{}).Names(); got == nil || len(got) != 0 {
		t.Errorf("empty plugin capabilities = %#v, want an empty non-nil slice", got)
	}
	p := csi.PluginCapabilities{ControllerService: true, OnlineExpansion: true}
	if got, want := p.Names(), []string{"CONTROLLER_SERVICE", "EXPANSION_ONLINE"}; !slices.Equal(got, want) {
		t.Errorf("plugin Names = %v, want %v", got, want)
	}
	c := csi.ControllerCapabilities{CreateDeleteVolume: true, ExpandVolume: true, CreateDeleteSnapshot: true, CloneVolume: true, ModifyVolume: true}
	if got, want := c.Names(), []string{"CREATE_DELETE_VOLUME", "CREATE_DELETE_SNAPSHOT", "CLONE_VOLUME", "EXPAND_VOLUME", "MODIFY_VOLUME"}; !slices.Equal(got, want) {
		t.Errorf("controller Names = %v, want %v", got, want)
	}
	n := csi.NodeCapabilities{StageUnstageVolume: true, ExpandVolume: true}
	if got, want := n.Names(), []string{"STAGE_UNSTAGE_VOLUME", "EXPAND_VOLUME"}; !slices.Equal(got, want) {
		t.Errorf("node Names = %v, want %v", got, want)
	}
}
