package proxy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// The proxy socket appears when the plugin's first allocation is
// registered, at <data_dir>/csi/<plugin>.sock with mode 0600, is shown in
// the plugin's status, answers for the plugin, and is removed when the
// plugin's last allocation goes and at shutdown.
func TestProxy_SocketLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.register("ex1", e.exampleSpec(filepath.Join(e.dir, "s1"), ""))
	sock := e.proxySocket("example")
	if want := e.rt.ProxySocket("example"); sock != want || sock != filepath.Join(e.dir, "d", "csi", "example.sock") {
		t.Fatalf("proxy socket %q, want %q", sock, want)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("proxy socket mode %s, want a socket with 0600", fi.Mode())
	}
	info, err := csipb.NewIdentityClient(dial(t, sock)).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetName() == "" || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo through the proxy: %v", info)
	}
	// An unknown method is Unimplemented, as from a plugin.
	err = dial(t, sock).Invoke(ctx, "/csi.v1.Node/NodeMount", &csipb.NodeGetInfoRequest{}, &csipb.NodeGetInfoResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method through the proxy: %v, want Unimplemented", err)
	}

	if err := e.rt.DeregisterAllocation(ctx, "ex1"); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the proxy socket removed", func() bool {
		_, err := os.Stat(sock)
		return errors.Is(err, os.ErrNotExist)
	})

	e.register("ex2", e.exampleSpec(filepath.Join(e.dir, "s2"), ""))
	sock = e.proxySocket("example")
	if err := e.rt.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("proxy socket after shutdown: %v, want it removed", err)
	}
}

// A plugin whose proxy socket path would be over the 107-byte unix limit
// has no proxy; its status says why, naming the path and the limit.
func TestProxy_SocketPathTooLong(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := fakeplugin.New(fakeplugin.Config{})
	psock := filepath.Join(e.dir, "p.sock")
	if err := p.Serve(psock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	name := "p" + strings.Repeat("x", 100)
	if _, err := e.rt.RegisterAllocation(ctx, "long", runtime.AllocationSpec{Plugin: name, Type: runtime.TypeNode, Socket: psock}); err != nil {
		t.Fatal(err)
	}
	path := e.rt.ProxySocket(name)
	var pl runtime.Plugin
	e.waitFor("the proxy error", func() bool {
		var err error
		pl, err = e.rt.Plugin(ctx, name)
		return err == nil && pl.ProxyError != ""
	})
	if pl.ProxySocket != "" || !strings.Contains(pl.ProxyError, path) || !strings.Contains(pl.ProxyError, "107-byte unix socket limit") {
		t.Fatalf("plugin status: socket %q, error %q; want no socket and an error naming %s and the limit", pl.ProxySocket, pl.ProxyError, path)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("%s exists", path)
	}
}
