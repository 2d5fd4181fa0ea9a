package api_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
)

// examplePluginEnv makes the test binary run as the example CSI plugin,
// exec-managed by a runtime of the spec tests (see testbin.RunExamplePlugin).
const examplePluginEnv = "CSIACTOR_API_TEST_EXAMPLE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(examplePluginEnv) != "" {
		os.Exit(testbin.RunExamplePlugin(os.Args[1:]))
	}
	leakcheck.VerifyTestMain(m)
}

// rawClient sends hand-made requests to an API address, to check status
// codes, headers and bodies byte for byte.
type rawClient struct {
	t    testing.TB
	base string
	hc   *http.Client
}

func newRawClient(t testing.TB, address string) *rawClient {
	t.Helper()
	tr := &http.Transport{}
	base := address
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		base = "http://csiactor"
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &rawClient{t: t, base: base, hc: &http.Client{Transport: tr}}
}

type rawResponse struct {
	status int
	header http.Header
	body   string
}

func (c *rawClient) do(method, path, body string, header ...string) rawResponse {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}
}
