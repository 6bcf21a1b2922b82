#!/usr/bin/env bash
# Builds ./caddy with this module from the working tree.
#   ./xcaddy.sh           build ./caddy
#   ./xcaddy.sh run       build, then serve Caddyfile.example (memory store)
#   ./xcaddy.sh version   print the module version a build records
# CADDY_VERSION and CADDY_OUT override the Caddy release and the output path.
set -euo pipefail
cd "$(dirname "$0")"

CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
XCADDY_VERSION=v0.4.5
out=${CADDY_OUT:-./caddy}

# module_version is the version this checkout is built under, which
# `caddy list-modules --versions` prints: the tag on HEAD (v0.1.0), else
# Go's pseudo-version of HEAD (v0.1.1-0.20261201210426-9b7c996b1f4a after
# v0.1.0, v0.0.0-20261201210426-9b7c996b1f4a before any tag), with
# "-dirty" when the tree has uncommitted changes; v0.0.0 outside git.
module_version() {
	local hash tag stamp version dirty=
	if ! hash=$(git rev-parse --short=12 HEAD 2>/dev/null); then
		echo v0.0.0
		return
	fi
	if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
		dirty=-dirty
	elif tag=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null); then
		echo "$tag"
		return
	fi
	stamp=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
	tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*' HEAD 2>/dev/null || true)
	if [[ $tag =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
		version="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))-0.$stamp-$hash"
	elif [[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+-[0-9A-Za-z.-]+$ ]]; then
		version="$tag.0.$stamp-$hash"
	else
		version="v0.0.0-$stamp-$hash"
	fi
	echo "$version$dirty"
}

module=$(go list -m)
version=$(module_version)
if [ "${1:-}" = version ]; then
	echo "$version"
	exit 0
fi

PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v xcaddy >/dev/null 2>&1; then
	echo "installing xcaddy $XCADDY_VERSION" >&2
	go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
fi

# The module is not published: build it from this directory, under the
# version above so that xcaddy never asks the module proxy for it.
xcaddy build "$CADDY_VERSION" --output "$out" --with "$module@$version=$PWD"

if [ "${1:-}" = run ]; then
	exec "$out" run --config Caddyfile.example --adapter caddyfile
fi
