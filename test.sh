#!/usr/bin/env bash
# Runs the whole test suite: vet, formatting, and every test with the race
# detector, including the end-to-end tests of the xcaddy-built binary on
# the newest Caddy release the module supports and, for their core, the
# oldest.
# Installs the servers the tests start themselves (redis-server, PostgreSQL)
# and promtool, which checks the alerting rules, when they are missing and
# this runs as root on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")"

have_initdb() {
	command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
have_initdb || missing+=(postgresql)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: missing ${missing[*]}; install them and run again" >&2
		exit 1
	fi
	echo "test.sh: installing ${missing[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# The prometheus package brings promtool with a Prometheus server, which
	# it starts where systemd runs (not in a container). The tests need
	# only promtool.
	if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
		systemctl disable --now prometheus.service >/dev/null 2>&1 || true
	fi
fi

# The e2e tests build Caddy with the module at ../xcaddy.sh's release, the
# newest supported, and run their core once more on the oldest, the one
# go.mod requires. Build that one in its own process group while vet runs.
oldest=$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)
bin=$(mktemp -d)
set -m
CADDY_VERSION=$oldest CADDY_OUT="$bin/caddy" ./xcaddy.sh >"$bin/build.log" 2>&1 &
building=$!
set +m
trap 'kill -- -"$building" 2>/dev/null || true; rm -rf "$bin"' EXIT

go vet ./...
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: gofmt would change: $unformatted" >&2
	exit 1
fi
if ! wait "$building"; then
	cat "$bin/build.log" >&2
	echo "test.sh: building Caddy $oldest with the module failed" >&2
	exit 1
fi
CADDY_BIN_OLDEST="$bin/caddy" go test -race -count=1 -timeout 20m ./...

# The benchmark harness is a module of its own: the tests of its load
# generator (the order of its rounds) and of its report run here too.
(cd bench && go vet ./... && go test -count=1 ./...)
