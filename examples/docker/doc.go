// Package docker holds an agent config (csiactor.yaml) that makes
// csiactor the volume plugin of Docker and Podman for the kubernetes-csi
// hostpath driver, and the containers.conf lines Podman needs; it has no
// code. Its test loads the config as the agent does.
package docker
