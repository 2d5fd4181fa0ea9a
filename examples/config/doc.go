// Package config holds the sample agent config (csiactor.yaml) and systemd
// unit (csiactor.service); it has no code. Its tests keep both from
// rotting: the sample loads, sets every key the agent knows, and shows the
// real defaults; the unit runs the agent on the sample's install path and
// never gives the service a mount namespace of its own.
package config
