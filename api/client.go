package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// Client talks to an agent's HTTP API. It implements [Backend], so code
// written against the runtime can drive a remote agent, and adds Health
// and FollowEvents. A Client is safe for concurrent use; Close releases its
// idle connections.
type Client struct {
	address   string
	base      string // scheme://host prefix of every request URL
	token     string
	transport *http.Transport
	hc        *http.Client
}

var _ Backend = (*Client)(nil)

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithToken makes the client send "Authorization: Bearer <token>", which
// the agent's TCP listener requires for everything but health and metrics.
func WithToken(token string) ClientOption {
	return func(c *Client) { c.token = token }
}

// WithTLSConfig makes the client use cfg for an https:// address: the CAs
// that verify the agent's certificate (RootCAs; nil means the system's)
// and the client certificate an agent with api.tls.client_ca_file asks
// for. NewClient fails with ErrBadAddress when it is given for an address
// that is not https://. The client keeps cfg; do not change it afterwards.
func WithTLSConfig(cfg *tls.Config) ClientOption {
	return func(c *Client) { c.transport.TLSClientConfig = cfg }
}

// NewClient returns a client of the agent at address:
// "unix:///path/api.sock" (or the bare absolute path) for the unix socket,
// "http://host:port" for the TCP listener, "https://host:port" for a TCP
// listener with TLS ([WithTLSConfig]). It does not connect yet.
func NewClient(address string, opts ...ClientOption) (*Client, error) {
	c := &Client{address: address}
	t := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 4,
		ForceAttemptHTTP2:   false,
	}
	switch {
	case strings.HasPrefix(address, "/"):
		c.base = "http://csiactor"
		t.DialContext = unixDialer(address)
	case strings.HasPrefix(address, "unix:"):
		u, err := url.Parse(address)
		if err != nil || u.Host != "" || !strings.HasPrefix(u.Path, "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("%w: %q: want unix:///absolute/path/api.sock", ErrBadAddress, address)
		}
		c.base = "http://csiactor"
		t.DialContext = unixDialer(u.Path)
	case strings.HasPrefix(address, "http://"), strings.HasPrefix(address, "https://"):
		u, err := url.Parse(address)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return nil, fmt.Errorf("%w: %q: want %s//host:port", ErrBadAddress, address, address[:strings.Index(address, ":")+1])
		}
		c.base = u.Scheme + "://" + u.Host
		t.Proxy = http.ProxyFromEnvironment
	default:
		return nil, fmt.Errorf("%w: %q: want unix:///path/api.sock, http://host:port or https://host:port", ErrBadAddress, address)
	}
	c.transport = t
	c.hc = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
		// The API never redirects; never follow one blindly.
		return http.ErrUseLastResponse
	}}
	for _, o := range opts {
		o(c)
	}
	if t.TLSClientConfig != nil && !strings.HasPrefix(address, "https://") {
		return nil, fmt.Errorf("%w: %q: TLS settings need an https:// address", ErrBadAddress, address)
	}
	return c, nil
}

func unixDialer(path string) func(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", path)
	}
}

// Address returns the address the client was made with.
func (c *Client) Address() string { return c.address }

// Close closes the client's idle connections. Streams in progress end when
// their contexts do.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

// Health asks the agent whether it is up; nil means it answered ok.
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/health", nil, nil, &out); err != nil {
		return err
	}
	if out.Status != "ok" {
		return fmt.Errorf("agent at %s reports status %q", c.address, out.Status)
	}
	return nil
}

// Ready asks the agent whether it has finished starting. A 503 answer
// with a readiness body is not an error: it is returned with its status
// (runtime.ReadyStarting) and what is pending.
func (c *Client) Ready(ctx context.Context) (runtime.Readiness, error) {
	resp, err := c.sendAny(ctx, http.MethodGet, "/v1/ready", nil, nil)
	if err != nil {
		return runtime.Readiness{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return runtime.Readiness{}, decodeError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return runtime.Readiness{}, fmt.Errorf("GET /v1/ready: %w", err)
	}
	var out runtime.Readiness
	if json.Unmarshal(data, &out) != nil || out.Status == "" {
		// A 503 from something else (a proxy, an error body).
		resp.Body = io.NopCloser(bytes.NewReader(data))
		return runtime.Readiness{}, decodeError(resp)
	}
	return out, nil
}

// Plugins lists every plugin.
func (c *Client) Plugins(ctx context.Context) ([]runtime.Plugin, error) {
	var out []runtime.Plugin
	return out, c.do(ctx, http.MethodGet, "/v1/plugins", nil, nil, &out)
}

// Plugin returns the plugin name.
func (c *Client) Plugin(ctx context.Context, name string) (runtime.Plugin, error) {
	var out runtime.Plugin
	return out, c.do(ctx, http.MethodGet, "/v1/plugins/"+url.PathEscape(name), nil, nil, &out)
}

// Allocations lists every allocation.
func (c *Client) Allocations(ctx context.Context) ([]runtime.Allocation, error) {
	var out []runtime.Allocation
	return out, c.do(ctx, http.MethodGet, "/v1/allocations", nil, nil, &out)
}

// RegisterAllocation registers the allocation id.
func (c *Client) RegisterAllocation(ctx context.Context, id string, spec runtime.AllocationSpec) (runtime.Allocation, error) {
	body, err := json.Marshal(spec)
	if err != nil {
		return runtime.Allocation{}, err
	}
	var out runtime.Allocation
	return out, c.do(ctx, http.MethodPut, "/v1/allocations/"+url.PathEscape(id), nil, body, &out)
}

// DeregisterAllocation deregisters the allocation id.
func (c *Client) DeregisterAllocation(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/allocations/"+url.PathEscape(id), nil, nil, nil)
}

// Volumes lists the volumes that match filter.
func (c *Client) Volumes(ctx context.Context, filter runtime.VolumeFilter) ([]runtime.Volume, error) {
	var out []runtime.Volume
	return out, c.do(ctx, http.MethodGet, "/v1/volumes", volumeQuery(filter), nil, &out)
}

// volumeQuery is the query of a listing with filter.
func volumeQuery(filter runtime.VolumeFilter) url.Values {
	q := url.Values{}
	if filter.Plugin != "" {
		q.Set("plugin", filter.Plugin)
	}
	if filter.Node != "" {
		q.Set("node", filter.Node)
	}
	if filter.AllHosts {
		q.Set("all_hosts", "true")
	}
	return q
}

// NextTokenHeader is the response header of a page of a listing that
// gives the next page's next_token; a last page has none.
const NextTokenHeader = "X-Csiactor-Next-Token"

// VolumesPage lists one page of the volumes that match filter: at most
// perPage from token (empty: the first page) on, and the next page's
// token, empty on the last page.
func (c *Client) VolumesPage(ctx context.Context, filter runtime.VolumeFilter, perPage int, token string) ([]runtime.Volume, string, error) {
	q := volumeQuery(filter)
	q.Set("per_page", strconv.Itoa(perPage))
	if token != "" {
		q.Set("next_token", token)
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/volumes", q, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	var out []runtime.Volume
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, "", fmt.Errorf("GET /v1/volumes: decode answer: %w", err)
	}
	return out, resp.Header.Get(NextTokenHeader), nil
}

// Volume returns the volume id.
func (c *Client) Volume(ctx context.Context, id string) (runtime.Volume, error) {
	var out runtime.Volume
	return out, c.do(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(id), nil, nil, &out)
}

// RegisterVolume registers an existing volume as id. Its secrets and mount
// flags are sent to the agent, which never shows them again.
func (c *Client) RegisterVolume(ctx context.Context, id string, spec runtime.VolumeSpec) (runtime.Volume, error) {
	body, err := spec.RequestJSON()
	if err != nil {
		return runtime.Volume{}, err
	}
	var out runtime.Volume
	return out, c.do(ctx, http.MethodPut, "/v1/volumes/"+url.PathEscape(id), nil, body, &out)
}

// CreateVolume creates a volume through the plugin's controller.
func (c *Client) CreateVolume(ctx context.Context, spec runtime.CreateVolumeSpec) (runtime.Volume, error) {
	body, err := spec.RequestJSON()
	if err != nil {
		return runtime.Volume{}, err
	}
	var out runtime.Volume
	return out, c.do(ctx, http.MethodPost, "/v1/volumes", nil, body, &out)
}

// DeleteVolume deregisters the volume id; with deleteToo the agent also
// deletes it through the controller.
func (c *Client) DeleteVolume(ctx context.Context, id string, deleteToo bool) error {
	var q url.Values
	if deleteToo {
		q = url.Values{"delete": {"true"}}
	}
	return c.do(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(id), q, nil, nil)
}

// Claim claims and publishes the volume volumeID.
func (c *Client) Claim(ctx context.Context, volumeID string, req runtime.ClaimRequest) (runtime.Claim, error) {
	body, err := req.RequestJSON()
	if err != nil {
		return runtime.Claim{}, err
	}
	var out runtime.Claim
	return out, c.do(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(volumeID)+"/claims", nil, body, &out)
}

// PluginCapacity asks plugin name's controller how much it can provision,
// in q.Topology when given (GET /v1/plugins/{name}/capacity).
func (c *Client) PluginCapacity(ctx context.Context, name string, q runtime.CapacityQuery) (runtime.Capacity, error) {
	v := url.Values{}
	if len(q.Topology) > 0 {
		v.Set("topology", runtime.FormatTopology(q.Topology))
	}
	var out runtime.Capacity
	return out, c.do(ctx, http.MethodGet, "/v1/plugins/"+url.PathEscape(name)+"/capacity", v, nil, &out)
}

// CallPlugin sends one raw CSI call to plugin name (POST
// /v1/plugins/{name}/call). A call the plugin fails returns no error: the
// result's Error has the plugin's code and message.
func (c *Client) CallPlugin(ctx context.Context, name string, call runtime.PluginCall) (runtime.PluginCallResult, error) {
	var out runtime.PluginCallResult
	body, err := json.Marshal(call)
	if err != nil {
		return out, err
	}
	return out, c.do(ctx, http.MethodPost, "/v1/plugins/"+url.PathEscape(name)+"/call", nil, body, &out)
}

// ListExternalVolumes lists one page of plugin name's own volumes, each
// with the ID it is registered under here (GET /v1/plugins/{name}/volumes).
func (c *Client) ListExternalVolumes(ctx context.Context, name string, q runtime.ExternalVolumesQuery) (runtime.ExternalVolumes, error) {
	v := url.Values{}
	if q.MaxEntries > 0 {
		v.Set("max_entries", strconv.Itoa(q.MaxEntries))
	}
	if q.StartingToken != "" {
		v.Set("starting_token", q.StartingToken)
	}
	var out runtime.ExternalVolumes
	return out, c.do(ctx, http.MethodGet, "/v1/plugins/"+url.PathEscape(name)+"/volumes", v, nil, &out)
}

// ModifyVolume changes volume id's mutable parameters and returns the
// volume once its plugin applied them (POST /v1/volumes/{id}/modify).
func (c *Client) ModifyVolume(ctx context.Context, id string, req runtime.ModifyRequest) (runtime.Volume, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return runtime.Volume{}, err
	}
	var out runtime.Volume
	return out, c.do(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(id)+"/modify", nil, body, &out)
}

// ExpandVolume grows volume id to at least req.CapacityBytes and returns
// the volume once it is done (POST /v1/volumes/{id}/expand).
func (c *Client) ExpandVolume(ctx context.Context, id string, req runtime.ExpandRequest) (runtime.Volume, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return runtime.Volume{}, err
	}
	var out runtime.Volume
	return out, c.do(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(id)+"/expand", nil, body, &out)
}

// Release releases alloc's claim on volumeID and returns the past claim.
func (c *Client) Release(ctx context.Context, volumeID, alloc string) (runtime.Claim, error) {
	var out runtime.Claim
	return out, c.do(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(volumeID)+"/claims/"+url.PathEscape(alloc), nil, nil, &out)
}

// Events returns the agent's recent events.
func (c *Client) Events(ctx context.Context) ([]runtime.Event, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/events", nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	evs := []runtime.Event{}
	err = readEvents(ctx, resp.Body, func(ev runtime.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return evs, nil
}

// AllocationLogs calls fn with the output lines of the exec-managed
// allocation id as q says: the last q.Tail lines (every kept line when
// negative), then with q.Follow every new line until ctx is done (it
// returns ctx.Err()), fn returns an error (it returns that), or the agent
// ends the stream (nil without Follow; ErrStreamEnded with it).
func (c *Client) AllocationLogs(ctx context.Context, id string, q runtime.LogsQuery, fn func(runtime.LogLine) error) error {
	v := url.Values{}
	if q.Tail >= 0 {
		v.Set("tail", strconv.Itoa(q.Tail))
	}
	if q.Follow {
		v.Set("follow", "true")
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/allocations/"+url.PathEscape(id)+"/logs", v, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var l runtime.LogLine
			if derr := json.Unmarshal(line, &l); derr != nil {
				return fmt.Errorf("decode log line: %w", derr)
			}
			if ferr := fn(l); ferr != nil {
				return ferr
			}
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, io.EOF) && q.Follow:
			return ErrStreamEnded
		case errors.Is(err, io.EOF):
			return nil
		default:
			return fmt.Errorf("read logs: %w", err)
		}
	}
}

// ErrStreamEnded is returned by FollowEvents and a following
// AllocationLogs when the agent closes the stream (it is shutting down,
// went away, or the allocation was deregistered).
var ErrStreamEnded = errors.New("the agent closed the event stream")

// FollowEvents calls fn with the recent events and then with every new one
// as it happens, until ctx is done (it returns ctx.Err()), fn returns an
// error (it returns that), or the agent ends the stream (ErrStreamEnded).
func (c *Client) FollowEvents(ctx context.Context, fn func(runtime.Event) error) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/events", url.Values{"follow": {"true"}}, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	err = readEvents(ctx, resp.Body, fn)
	if errors.Is(err, io.EOF) {
		return ErrStreamEnded
	}
	return err
}

// Subscribe follows the agent's events on a channel, which is closed when
// ctx is done or the stream ends. A goroutine feeds the channel; it exits
// once ctx is done or the stream ends, so cancel ctx when done.
func (c *Client) Subscribe(ctx context.Context) (<-chan runtime.Event, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/events", url.Values{"follow": {"true"}}, nil)
	if err != nil {
		return nil, err
	}
	ch := make(chan runtime.Event, 64)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		_ = readEvents(ctx, resp.Body, func(ev runtime.Event) error {
			select {
			case ch <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	return ch, nil
}

// readEvents decodes newline-delimited events from r and calls fn with
// each; it returns io.EOF at the end of the stream, ctx.Err() once ctx is
// done, or the first decode or fn error.
func readEvents(ctx context.Context, r io.Reader, fn func(runtime.Event) error) error {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev runtime.Event
			if derr := json.Unmarshal(line, &ev); derr != nil {
				return fmt.Errorf("decode event: %w", derr)
			}
			if ferr := fn(ev); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return fmt.Errorf("read events: %w", err)
		}
	}
}

// do sends a request and decodes a JSON answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body []byte, out any) error {
	resp, err := c.send(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// send sends a request and returns the response of a 2xx answer; other
// answers become *Error, dial failures *UnreachableError.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body []byte) (*http.Response, error) {
	resp, err := c.sendAny(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// sendAny is send for a caller that reads non-2xx answers itself.
func (c *Client) sendAny(ctx context.Context, method, path string, q url.Values, body []byte) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if dl, ok := ctx.Deadline(); ok {
		// The agent ends a wait for a restarting plugin in time to say
		// so before this deadline.
		req.Header.Set(TimeoutHeader, time.Until(dl).Round(time.Millisecond).String())
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, &UnreachableError{Address: c.address, Err: op.Err}
		}
		return nil, fmt.Errorf("%s %s at %s: %w", method, path, c.address, err)
	}
	return resp, nil
}

// decodeError turns an error answer into *Error, reading at most 64 KiB of
// its body.
func decodeError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb errorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
		return &Error{Status: resp.StatusCode, Message: eb.Error}
	}
	msg := strings.TrimSpace(string(data))
	switch {
	case msg == "":
		msg = http.StatusText(resp.StatusCode)
	case resp.StatusCode == http.StatusBadRequest && msg == plainToTLS:
		msg = "the agent serves TLS on this address: use an https:// address"
	}
	return &Error{Status: resp.StatusCode, Message: strconv.Itoa(resp.StatusCode) + " " + msg}
}

// plainToTLS is what Go's HTTPS servers answer a plain HTTP request with.
const plainToTLS = "Client sent an HTTP request to an HTTPS server."
