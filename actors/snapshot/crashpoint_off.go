//go:build !crashpoints

package snapshot

// crashHook returns nil: without the crashpoints build tag there are no
// crash points (see crashpoint_on.go).
func crashHook() func(point, snapshot string) { return nil }
