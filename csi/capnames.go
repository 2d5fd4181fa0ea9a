package csi

// Names returns the capabilities the plugin announced, by their CSI names
// (CONTROLLER_SERVICE, VOLUME_ACCESSIBILITY_CONSTRAINTS) and, for volume
// expansion, EXPANSION_ONLINE and EXPANSION_OFFLINE. It never returns nil.
func (c PluginCapabilities) Names() []string {
	return names([]capName{
		{c.ControllerService, "CONTROLLER_SERVICE"},
		{c.VolumeAccessibilityConstraints, "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
		{c.OnlineExpansion, "EXPANSION_ONLINE"},
		{c.OfflineExpansion, "EXPANSION_OFFLINE"},
	})
}

// Names returns the controller RPC capabilities by their CSI names, like
// CREATE_DELETE_VOLUME. It never returns nil.
func (c ControllerCapabilities) Names() []string {
	return names([]capName{
		{c.CreateDeleteVolume, "CREATE_DELETE_VOLUME"},
		{c.PublishUnpublishVolume, "PUBLISH_UNPUBLISH_VOLUME"},
		{c.ListVolumes, "LIST_VOLUMES"},
		{c.GetCapacity, "GET_CAPACITY"},
		{c.CreateDeleteSnapshot, "CREATE_DELETE_SNAPSHOT"},
		{c.ListSnapshots, "LIST_SNAPSHOTS"},
		{c.CloneVolume, "CLONE_VOLUME"},
		{c.PublishReadonly, "PUBLISH_READONLY"},
		{c.ExpandVolume, "EXPAND_VOLUME"},
		{c.GetVolume, "GET_VOLUME"},
		{c.SingleNodeMultiWriter, "SINGLE_NODE_MULTI_WRITER"},
		{c.VolumeCondition, "VOLUME_CONDITION"},
		{c.GetVolumeHealth, "GET_VOLUME_HEALTH"},
		{c.ModifyVolume, "MODIFY_VOLUME"},
	})
}

// Names returns the node RPC capabilities by their CSI names, like
// STAGE_UNSTAGE_VOLUME. It never returns nil.
func (c NodeCapabilities) Names() []string {
	return names([]capName{
		{c.StageUnstageVolume, "STAGE_UNSTAGE_VOLUME"},
		{c.GetVolumeStats, "GET_VOLUME_STATS"},
		{c.ExpandVolume, "EXPAND_VOLUME"},
		{c.SingleNodeMultiWriter, "SINGLE_NODE_MULTI_WRITER"},
		{c.VolumeMountGroup, "VOLUME_MOUNT_GROUP"},
		{c.VolumeCondition, "VOLUME_CONDITION"},
		{c.GetVolumeHealth, "GET_VOLUME_HEALTH"},
	})
}

// capName is one capability: whether it is set, and its name.
type capName struct {
	on   bool
	name string
}

// names returns the names of the capabilities that are set, in order.
func names(cs []capName) []string {
	out := []string{}
	for _, c := range cs {
		if c.on {
			out = append(out, c.name)
		}
	}
	return out
}
