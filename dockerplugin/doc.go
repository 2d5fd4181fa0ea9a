// Package dockerplugin makes csiactor the volume plugin of Docker and
// Podman: it serves Docker's volume plugin protocol v1 for the drivers of
// the agent's docker config section, each on top of one CSI plugin, so
// that `docker volume create -d NAME` and `docker run -v VOLUME:/path`
// (or the same with podman) create, mount and remove volumes of any CSI
// driver, through the agent's crash-safe claims.
//
// # Basics
//
// [Start] listens on <plugin_dir>/<name>.sock for each driver (Docker
// finds plugins by their socket there, /run/docker/plugins by default;
// Podman by the volume_plugins table of containers.conf) and answers
// /Plugin.Activate and /VolumeDriver.Create, Remove, Mount, Unmount, Path,
// Get, List and Capabilities. Errors are a non-200 status (400, 404, 409,
// 503 or 500, as the HTTP API's) with a body {"Err": "..."}.
//
// Create makes a volume through the plugin's controller, or registers an
// existing one with -o external-id=ID. Its options are the names of
// Swarm's cluster-volume flags: size, type (mount or block), sharing
// (none, readonly, onewriter or all), scope (single or multi), fs-type and
// topology-required (KEY=VALUE,...); sharing and scope map to CSI access
// modes as swarmkit maps them, except that sharing onewriter and all on
// one node are single-node-multi-writer, since each container is a claim
// of its own. Any other key is a CSI parameter (or, with
// external-id, context.KEY a volume context entry). Where an option is
// missing, the driver's defaults apply. Secrets are never options, since
// the engines keep options and print them: a volume gets the secrets of
// the driver's defaults, or `csiactor volume update` sets them.
//
// Each Mount is a claim of the volume by the allocation
// "docker-<mount ID>", published before Mount answers; the answer is the
// claim's target path, which the engine bind-mounts into the container.
// The engines reuse mount IDs (Docker for `docker cp` and restarts,
// Podman always), so references are counted per volume and mount ID, and
// the counts are kept in <data_dir>/docker/mounts.json, written (and
// synced) before the claim is made or released. The claim is released
// when the last reference goes, after a grace period
// (docker.unmount_grace): Docker mounts and unmounts a new volume, with a
// mount ID of its own, to copy an image's content into it just before the
// container mounts it. A Mount with a new ID takes over a claim waiting
// out its grace period (the container after that copy, or the next
// container), with no RPC.
//
// Get, List and Path answer from the agent's records, without a call to
// the plugin, so a volume answers while its plugin is down. Remove
// refuses while the volume is mounted (or claimed on any host, in cluster
// mode); it deletes through the controller a volume Create made, and only
// deregisters one registered with external-id.
//
// # Restarts
//
// Claims survive an agent restart, and so do the running containers'
// mounts. An engine that dies or restarts (or a container killed without an
// Unmount) can leave references that no container holds: every
// docker.reconcile_interval the agent asks each engine's API (GET
// /containers/json) which containers hold volumes of its drivers (any
// container that has not exited: one being started is "created" when its
// Mount comes), and releases a mount that two checks in a row found
// unheld with no Mount in between, as an event "docker-mount-released".
// A check that cannot reach every engine changes nothing.
//
// # Caveats
//
// Podman gives up on a plugin call after volume_plugin_timeout (5 s by
// default, in containers.conf); a Mount of a volume whose plugin takes
// longer to publish fails there, and the claim is released. Docker waits
// longer. The engines' mount requests carry no read-only flag: a claim is
// a write claim unless the volume's access mode is read-only
// (-o sharing=readonly).
package dockerplugin
