package dockerplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// engineTimeout bounds one call to an engine's API.
const engineTimeout = 10 * time.Second

// released are the container states in which a container holds none of
// its volumes. Any other state may hold them: created is also the state
// of a container being started, whose Mount has come and which is not
// running yet, and of one that `docker cp` mounts.
var released = map[string]bool{"exited": true, "dead": true, "stopped": true}

// reconcileLoop checks the mounts against the engines at start and then
// every reconcile interval, until Shutdown.
func (s *Server) reconcileLoop() {
	defer s.wg.Done()
	suspects := map[mountKey]uint64{}
	seen := map[string]bool{} // default engines whose socket has appeared
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	ctx := s.ctx
	failing := false
	for {
		err := s.reconcile(ctx, suspects, seen)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			s.log.WithError(err).Warn("docker: cannot ask the engines which containers hold volumes; no mount is released until they answer")
		case err == nil && failing:
			s.log.Info("docker: the engines answer again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcile releases the mounts that no container of the engines held
// at this check nor the one before (suspects, with no Mount in between),
// and marks the unheld ones for the next check. Every configured engine
// must answer; a default engine must once its socket has appeared (seen).
// With no engine to ask, nothing is released.
func (s *Server) reconcile(ctx context.Context, suspects map[mountKey]uint64, seen map[string]bool) error {
	held := map[[2]string]bool{} // driver, volume
	asked := 0
	for _, e := range s.engines {
		if s.defaultEngines && !seen[e] {
			if _, err := os.Stat(e); err != nil {
				continue
			}
			seen[e] = true
			s.log.WithField("engine", e).Info("docker: reconciling mounts with the engine")
		}
		if err := listHolders(ctx, e, held); err != nil {
			return err
		}
		asked++
	}
	if asked == 0 {
		return nil
	}
	counted := map[mountKey]bool{}
	for _, e := range s.book.entries("") {
		k := mountKey{e.Volume, e.ID}
		if e.Refs == 0 {
			continue // its release is scheduled
		}
		counted[k] = true
		if held[[2]string{e.Driver, e.Volume}] {
			delete(suspects, k)
			continue
		}
		if gen, ok := suspects[k]; !ok || gen != e.gen {
			suspects[k] = e.gen
			continue
		}
		delete(suspects, k)
		s.releaseUnheld(ctx, k, e.Driver)
	}
	for k := range suspects {
		if !counted[k] {
			delete(suspects, k)
		}
	}
	return nil
}

// releaseUnheld releases k unless a Mount came since the check.
func (s *Server) releaseUnheld(ctx context.Context, k mountKey, driver string) {
	defer s.lock(k.volume)()
	r, ok := s.book.get(k)
	if !ok || r.Refs == 0 {
		return
	}
	// Zero the count first, so that a crash before the release leaves
	// it scheduled for the next start.
	if _, _, err := s.book.add(k, driver, -r.Refs); err != nil {
		s.log.WithError(err).Warn("docker: cannot record a release")
		return
	}
	why := fmt.Sprintf("no container of the engines holds it any more (%d references without Unmount)", r.Refs)
	if err := s.releaseLocked(ctx, k, why); err != nil {
		s.log.WithError(err).WithField("volume", k.volume).Warn("docker: release failed; tried again later")
		s.scheduleRelease(k)
		return
	}
	s.rt.RecordEvent(runtime.Event{
		Type: EventMountReleased, Volume: k.volume, Alloc: r.Alloc,
		Message: fmt.Sprintf("driver %s: mount released: %s", driver, why),
	})
}

// engineContainer is what the engines' GET /containers/json tells of a
// container (Docker's API; Podman's compatible API says the same).
type engineContainer struct {
	ID     string `json:"Id"`
	State  string `json:"State"`
	Mounts []struct {
		Type   string `json:"Type"`
		Name   string `json:"Name"`
		Driver string `json:"Driver"`
	} `json:"Mounts"`
}

// listHolders adds to held the (driver, volume) of every volume mounted
// in a container of the engine at socket that holds its mounts.
func listHolders(ctx context.Context, socket string, held map[[2]string]bool) error {
	ctx, cancel := context.WithTimeout(ctx, engineTimeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine/containers/json?all=1", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("engine %s: %w", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("engine %s: GET /containers/json: %s: %s", socket, resp.Status, msg)
	}
	var cs []engineContainer
	if err := json.NewDecoder(resp.Body).Decode(&cs); err != nil {
		return fmt.Errorf("engine %s: GET /containers/json: %w", socket, err)
	}
	for _, c := range cs {
		if released[c.State] {
			continue
		}
		for _, m := range c.Mounts {
			if m.Type == "volume" && m.Name != "" {
				held[[2]string{m.Driver, m.Name}] = true
			}
		}
	}
	return nil
}
