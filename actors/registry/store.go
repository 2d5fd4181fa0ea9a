package registry

import (
	"context"

	"github.com/csiactor/csiactor/persistence"
)

// Store is what the registry needs from the store; *persistence.Store
// implements it.
type Store interface {
	// PutAllocation stores a, assigning its creation sequence (Seq) the
	// first time its ID is stored and keeping it afterwards.
	PutAllocation(ctx context.Context, a persistence.Allocation) (persistence.Allocation, error)
	// DeleteAllocation removes the allocation.
	DeleteAllocation(ctx context.Context, id string) error
	// Allocations returns every allocation, sorted by Seq.
	Allocations(ctx context.Context) ([]persistence.Allocation, error)
}

var _ Store = (*persistence.Store)(nil)
