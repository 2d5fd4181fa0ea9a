// Package packaging holds what `make deb` builds the Debian package from:
// nfpm.yaml (its contents and metadata), deb/ (the maintainer scripts) and
// debversion.sh (VERSION as a Debian version); it has no code. Its tests
// build the package and check it with dpkg-deb, run the packaged binary,
// run the maintainer scripts against a stand-in systemctl, and, where CI
// asks for it (CSIACTOR_TEST_DPKG_INSTALL=1, as root), install, remove and
// purge it with apt and dpkg.
package packaging
