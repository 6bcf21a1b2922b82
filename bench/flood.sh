#!/usr/bin/env bash
# The memory store under a flood of new keys, two revisions side by side
# (issue 36: does the memory store's own table pay, against a Go map and
# container/list?). Builds Caddy from each revision, then in alternating
# rounds runs each alone, fresh, with a memory store of up to a million
# records in front of the bench upstream, under new keys for DUR: enough to
# fill the table and evict. Per run: requests, Caddy's CPU per request,
# its garbage collector's CPU (GODEBUG=gctrace=1), and its peak RSS.
#
#   bench/flood.sh <old-rev> [<new-rev>]    new-rev defaults to the working tree
#
# Environment: DUR=150s CONC=16 ROUNDS=2 ENTRIES=1000000.
# Output: bench/out/flood/ (results.txt, one line per run, and the logs).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=$here/out/flood
old_rev=${1:?usage: bench/flood.sh <old-rev> [<new-rev>]}
new_rev=${2:-}
DUR=${DUR:-150s}
CONC=${CONC:-16}
ROUNDS=${ROUNDS:-2}
ENTRIES=${ENTRIES:-1000000}
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
MODULE=github.com/caddy-idempotency/caddy-idempotency
PATH="$(go env GOPATH)/bin:$PATH"
command -v xcaddy >/dev/null 2>&1 || go install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5

rm -rf "$out" && mkdir -p "$out"
(cd "$here" && go build -o "$out/loadgen" ./loadgen && go build -o "$out/upstream" ./upstream)
L=$out/loadgen

build() { # name, source directory
	(cd "$out" && xcaddy build "$CADDY_VERSION" --output "$out/caddy-$1" \
		--with "$MODULE@v0.0.0=$2" --replace "$MODULE=$2") >"$out/build-$1.log" 2>&1 ||
		{ tail -20 "$out/build-$1.log" >&2; exit 1; }
}
export_rev() { # rev, directory
	mkdir -p "$2" && (cd "$repo" && git archive "$1") | tar -x -C "$2"
}
echo "flood: building $old_rev and ${new_rev:-the working tree}" >&2
export_rev "$old_rev" "$out/src-old"
build old "$out/src-old"
if [ -n "$new_rev" ]; then
	export_rev "$new_rev" "$out/src-new"
	build new "$out/src-new"
else
	build new "$repo"
fi

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
"$out/upstream" -addr-file "$out/upstream.addr" >"$out/upstream.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/upstream.addr" ] && break; sleep 0.05; done
up=$(cat "$out/upstream.addr")

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime
hz=$(getconf CLK_TCK)
: >"$out/results.txt"
for ((round = 0; round < ROUNDS; round++)); do
	for b in old new; do
		[ $((round % 2)) -eq 1 ] && b=$([ "$b" = old ] && echo new || echo old) # alternate who goes first
		ap=$($L freeport) port=$($L freeport)
		cat >"$out/Caddyfile" <<CF
{
	admin 127.0.0.1:$ap
	auto_https off
	persist_config off
}
http://127.0.0.1:$port {
	idempotency {
		ttl 1h
		store memory {
			max_entries $ENTRIES
			max_bytes 4GiB
		}
	}
	reverse_proxy $up
}
CF
		log=$out/caddy-$b-$round.log
		GODEBUG=gctrace=1 "$out/caddy-$b" run --config "$out/Caddyfile" --adapter caddyfile >"$log" 2>&1 &
		cpid=$!
		for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
		gc0=$(grep -c '^gc ' "$log" || true)
		c0=$(ticks "$cpid")
		"$L" run -url "http://127.0.0.1:$port/orders" -mode new -conc "$CONC" -warmup 0s -duration "$DUR" >"$out/last.json"
		c1=$(ticks "$cpid")
		hwm=$(awk '/VmHWM/ {print $2}' "/proc/$cpid/status")
		kill "$cpid" && wait "$cpid" 2>/dev/null || true
		# gctrace: "..., A+B/C/D+E ms cpu, ...": every figure is GC CPU.
		gcms=$(tail -n +"$((gc0 + 1))" "$log" | grep '^gc ' | sed -E 's/.* ([0-9.+/]+) ms cpu.*/\1/' |
			tr '+/' '\n\n' | awk '{s += $1} END {printf "%.0f", s}')
		n=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("requests") or d.get("ok") or 0)' "$out/last.json")
		line=$(awk -v b="$b" -v r="$round" -v n="$n" -v c=$((c1 - c0)) -v hz="$hz" -v gc="$gcms" -v hwm="$hwm" 'BEGIN {
			printf "%s round %d: %d requests, Caddy CPU %.1f us/request, GC CPU %.1f us/request (%d ms), peak RSS %d MiB\n",
				b, r, n, c / hz * 1e6 / n, gc * 1000 / n, gc, hwm / 1024 }')
		echo "$line" | tee -a "$out/results.txt" >&2
	done
done
