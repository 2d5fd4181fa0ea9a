package runtime

import (
	"context"
	"fmt"
	"sort"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
)

// MaxVolumesPerPage is the largest per_page of a volume listing.
const MaxVolumesPerPage = cluster.MaxVolumePage

// volumesListPage is the page Volumes reads at a time in cluster mode.
const volumesListPage = 500

// VolumesPage lists, by ID, at most perPage (1 to MaxVolumesPerPage)
// volumes that match filter, from the position token gives: empty for the
// first page, else the next token of the page before. next is the token
// of the page after, empty on the last page. A volume registered or
// deregistered while a listing pages is in it or not; every other volume
// is in exactly one page. A bad perPage or token is a *FieldError naming
// per_page or next_token.
//
// In cluster mode the volumes come from etcd, one request per page (and
// one more for the claims with AllHosts): the host's own record, with its
// claims, for the volumes it keeps, and the cluster's definition for the
// others.
func (r *Runtime) VolumesPage(ctx context.Context, filter VolumeFilter, perPage int, token string) (vs []Volume, next string, err error) {
	if err := ValidatePage(perPage, token); err != nil {
		return nil, "", err
	}
	if err := filter.Validate(); err != nil {
		return nil, "", err
	}
	if err := r.ready(); err != nil {
		return nil, "", err
	}
	f := volume.Filter{Plugin: filter.Plugin, NodeID: filter.Node}
	if r.cluster == nil {
		mvs, next, err := r.volumes.ListPage(ctx, f, token, perPage)
		if err != nil {
			return nil, "", mapErr(err)
		}
		out := make([]Volume, 0, len(mvs))
		for _, v := range mvs {
			out = append(out, volumeFromManager(v))
		}
		return out, next, nil
	}
	return r.clusterVolumesPage(ctx, filter, f, perPage, token)
}

// ValidatePage checks the page size and token of a listing; the error is
// a *FieldError naming per_page or next_token.
func ValidatePage(perPage int, token string) error {
	if perPage < 1 || perPage > MaxVolumesPerPage {
		return fieldErr("per_page", fmt.Sprintf("%d: want 1 to %d", perPage, MaxVolumesPerPage))
	}
	if token != "" && ValidateID("next_token", token) != nil {
		return fieldErr("next_token", fmt.Sprintf("%q is not a token this API gave", token))
	}
	return nil
}

// clusterVolumesPage is VolumesPage in cluster mode.
func (r *Runtime) clusterVolumesPage(ctx context.Context, filter VolumeFilter, f volume.Filter, perPage int, from string) ([]Volume, string, error) {
	out := make([]Volume, 0, perPage)
	next := ""
	for {
		defs, after, err := r.cluster.VolumePage(ctx, from, perPage)
		if err != nil {
			return nil, "", mapErr(err)
		}
		for i, e := range defs {
			if len(out) == perPage {
				next = defs[i].ID
				break
			}
			v, ok := r.listedVolume(ctx, e)
			if ok && f.Matches(v) {
				out = append(out, volumeFromManager(v))
			}
		}
		if next != "" || after == "" {
			break
		}
		if len(out) == perPage {
			next = after
			break
		}
		from = after
	}
	var recorded map[string][]cluster.HostClaim
	if filter.AllHosts && len(out) > 0 {
		// Unreachable: this host's claims only.
		recorded, _ = r.cluster.ClaimsBetween(ctx, out[0].ID, out[len(out)-1].ID)
	}
	for i := range out {
		out[i] = r.withHosts(out[i], recorded[out[i].ID])
	}
	return out, next, nil
}

// listedVolume is the status of the volume of e, a definition in etcd: this
// host's record when it keeps the volume, else the definition's. It is
// false for a definition that cannot be read (logged).
func (r *Runtime) listedVolume(ctx context.Context, e cluster.VolumeEvent) (volume.Volume, bool) {
	if r.volumes.Known(e.ID) {
		if v, err := r.volumes.Get(ctx, e.ID); err == nil {
			return v, true
		}
	}
	cv, _, err := decodeClusterVolume(e.ID, e.Def, r.keys)
	var vs volume.Spec
	if err == nil {
		vs, err = cv.volumeSpec()
	}
	if err != nil {
		r.log.WithFields(logrus.Fields{"component": "cluster", "volume": e.ID}).WithError(err).Warn("cannot read a volume definition from the cluster; left out of the list")
		return volume.Volume{}, false
	}
	v := volume.MirrorView(vs)
	v.Created = cv.Created
	return v, true
}

// Volumes lists the volumes that match filter, by ID: every page of
// VolumesPage in cluster mode.
func (r *Runtime) Volumes(ctx context.Context, filter VolumeFilter) ([]Volume, error) {
	if err := filter.Validate(); err != nil {
		return nil, err
	}
	if err := r.ready(); err != nil {
		return nil, err
	}
	if r.cluster != nil {
		var out []Volume
		for token := ""; ; {
			vs, next, err := r.VolumesPage(ctx, filter, volumesListPage, token)
			if err != nil {
				return nil, err
			}
			out = append(out, vs...)
			if next == "" {
				return out, nil
			}
			token = next
		}
	}
	vs, err := r.volumes.List(ctx, volume.Filter{Plugin: filter.Plugin, NodeID: filter.Node})
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Volume, 0, len(vs))
	for _, v := range vs {
		out = append(out, volumeFromManager(v))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
