package cluster

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// requireLeader sends every request with the require-leader metadata and
// sends it again while the member answers that it has no leader; any other
// answer, and the end of the request's context, end it.
func TestRequireLeader(t *testing.T) {
	otherErr := rpctypes.ErrGRPCKeyNotFound
	for _, c := range []struct {
		name    string
		answers []error // what each attempt gets; the last repeats
		cancel  bool    // the context is canceled before the call
		calls   int
		want    error
	}{
		{name: "answered", answers: []error{nil}, calls: 1},
		{name: "no leader twice, then answered", answers: []error{rpctypes.ErrGRPCNoLeader, rpctypes.ErrGRPCNoLeader, nil}, calls: 3},
		{name: "other error not sent again", answers: []error{otherErr}, calls: 1, want: otherErr},
		{name: "no leader until the context ends", answers: []error{rpctypes.ErrGRPCNoLeader}, cancel: true, calls: 1, want: rpctypes.ErrGRPCNoLeader},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancel {
				cancel()
			}
			calls := 0
			invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				if got := md.Get(rpctypes.MetadataRequireLeaderKey); len(got) != 1 || got[0] != rpctypes.MetadataHasLeader {
					t.Errorf("attempt %d: require-leader metadata %q", calls+1, got)
				}
				err := c.answers[min(calls, len(c.answers)-1)]
				calls++
				return err
			}
			err := requireLeader(ctx, "/etcdserverpb.KV/Txn", nil, nil, nil, invoker)
			if !errors.Is(err, c.want) {
				t.Errorf("requireLeader = %v, want %v", err, c.want)
			}
			if calls != c.calls {
				t.Errorf("%d attempts, want %d", calls, c.calls)
			}
		})
	}
}
