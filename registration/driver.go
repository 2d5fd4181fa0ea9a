package registration

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrRefused marks a registration the Registrar will not make whatever
// the number of attempts (an invalid name, a socket another allocation
// uses): the watcher tells the registrar why, through
// NotifyRegistrationStatus, and does not try again until the
// registration socket is created again. Other Register errors are retried
// with backoff.
var ErrRefused = errors.New("registration refused")

// Driver is a CSI driver announced on a registration socket, checked by
// the watcher: its type is CSIPlugin and it speaks a CSI 1.x version.
type Driver struct {
	// Name is the driver's name: the plugin name its allocation is
	// registered under.
	Name string
	// Endpoint is the path of the driver's CSI socket.
	Endpoint string
	// Versions are the versions the driver announced.
	Versions []string
	// Socket is the registration socket that announced it.
	Socket string
}

// checkInfo turns what a registrar announced on socket into a Driver, or
// says why it is refused: the reason is sent back to the registrar and
// logged, and names what is wrong.
func checkInfo(info PluginInfo, socket string) (Driver, error) {
	if info.Type != TypeCSIPlugin {
		return Driver{}, fmt.Errorf("%w: plugin type %q is not supported: csiactor registers CSI drivers (type %s) only", ErrRefused, info.Type, TypeCSIPlugin)
	}
	if info.Name == "" {
		return Driver{}, fmt.Errorf("%w: the driver announced no name", ErrRefused)
	}
	if !speaksCSI1(info.SupportedVersions) {
		if len(info.SupportedVersions) == 0 {
			return Driver{}, fmt.Errorf("%w: CSI driver %q announced no supported versions; csiactor speaks CSI 1.x", ErrRefused, info.Name)
		}
		return Driver{}, fmt.Errorf("%w: CSI driver %q supports versions [%s], none of them 1.x; csiactor speaks CSI 1.x",
			ErrRefused, info.Name, strings.Join(info.SupportedVersions, ", "))
	}
	ep := strings.TrimPrefix(info.Endpoint, "unix://")
	if ep == "" {
		ep = socket // the registration socket serves CSI too, as the kubelet assumes
	}
	if !filepath.IsAbs(ep) || filepath.Clean(ep) != ep {
		return Driver{}, fmt.Errorf("%w: CSI driver %q: endpoint %q is not a clean absolute path of a unix socket", ErrRefused, info.Name, info.Endpoint)
	}
	return Driver{Name: info.Name, Endpoint: ep, Versions: info.SupportedVersions, Socket: socket}, nil
}

// speaksCSI1 says whether one of versions is a CSI 1.x version: "1",
// "1.y" or "1.y.z", with an optional leading "v".
func speaksCSI1(versions []string) bool {
	for _, v := range versions {
		parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
		if len(parts) > 3 {
			continue
		}
		ok := true
		for _, p := range parts {
			if _, err := strconv.ParseUint(p, 10, 32); err != nil {
				ok = false
			}
		}
		if ok && parts[0] == "1" {
			return true
		}
	}
	return false
}
