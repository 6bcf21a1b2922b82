#!/usr/bin/env bash
# Builds ./caddy with this module from the working tree.
#   ./xcaddy.sh         build ./caddy
#   ./xcaddy.sh run     build, then serve Caddyfile.example (memory store)
# CADDY_VERSION and CADDY_OUT override the Caddy release and the output path.
set -euo pipefail
cd "$(dirname "$0")"

CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
XCADDY_VERSION=v0.4.5
out=${CADDY_OUT:-./caddy}

PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v xcaddy >/dev/null 2>&1; then
	echo "installing xcaddy $XCADDY_VERSION" >&2
	go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
fi

module=$(go list -m)
# The module is not published: build it from this directory, under an
# explicit version so that xcaddy never asks the module proxy for it.
xcaddy build "$CADDY_VERSION" --output "$out" --with "$module@v0.0.0=$PWD"

if [ "${1:-}" = run ]; then
	exec "$out" run --config Caddyfile.example --adapter caddyfile
fi
