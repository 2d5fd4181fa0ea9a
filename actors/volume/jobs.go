package volume

import "github.com/csiactor/csiactor/actors/claim"

// jobs holds the pool that runs the goroutines volume actors own (see
// claim.StartJob) and dispatches their mailboxes.
type jobs struct {
	pool *claim.Pool
}
