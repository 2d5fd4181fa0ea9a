#!/bin/sh
# debversion.sh VERSION: the Debian package version of a csiactor VERSION
# (what `git describe --tags --always --dirty` gives, and `csiactor version`
# reports). dpkg needs a version that starts with a digit and sorts like
# the releases, and reads its last "-" as the Debian revision, so:
#   v1.2.3                   -> 1.2.3
#   v1.2.3-4-gabcdef0        -> 1.2.3+4.gabcdef0   (after 1.2.3, before 1.2.4)
#   v1.2.3-4-gabcdef0-dirty  -> 1.2.3+4.gabcdef0.dirty
#   abcdef0 (no tag yet)     -> 0.0.0+git.abcdef0
#   abcdef0-dirty            -> 0.0.0+git.abcdef0.dirty
set -eu
[ $# -eq 1 ] && [ -n "$1" ] || { echo "usage: $0 VERSION (not empty)" >&2; exit 2; }
v=$(printf '%s\n' "$1" | sed -E '/^v?[0-9]+\.[0-9]/!s/^/0.0.0+git./; s/^v//; /\+/!s/-/+/; s/-/./g')
case "$v" in
*[!A-Za-z0-9.+~]*) echo "$0: version $1 gives $v, which has characters a Debian version cannot" >&2; exit 1 ;;
esac
printf '%s\n' "$v"
