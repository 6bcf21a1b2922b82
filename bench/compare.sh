#!/usr/bin/env bash
# Before/after comparison of two revisions of the module, whole Caddy
# processes side by side (issue 5): builds Caddy from each revision (with the
# same baseline handler from this tree), runs both at once against one
# private redis-server and one upstream, and drives the same routes of each
# in rounds of changing order, so that both builds see the same machine.
# Prints medians and paired per-round ratios (new/old of each route, and
# redis/baseline_cas within each build).
#
#   bench/compare.sh <old-rev> [<new-rev>]   new-rev defaults to the working tree
#
# Environment: CONC=16 ROUNDS=6 DUR=2s ROUTES="baseline_cas redis memory"
# (redis_cached, the redis store with local_cache 64MiB; postgres, on a
# private PostgreSQL cluster made with initdb; file, a bbolt file each, too
# when named) MODES="new replay". Output (logs, raw results) goes to
# bench/out/compare/. CPU per request is Caddy's plus its store server's:
# Redis, or the postmaster and all its backends.
#
# Both processes also serve a memory route, whose records live in their
# heap: the garbage collector's cost of that heap falls on every route of
# the process, baseline_cas included, so compare routes within a build
# (redis/baseline_cas) as well as across builds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=$here/out/compare
old_rev=${1:?usage: bench/compare.sh <old-rev> [<new-rev>]}
new_rev=${2:-}
CONC=${CONC:-16}
ROUNDS=${ROUNDS:-6}
DUR=${DUR:-2s}
ROUTES=${ROUTES:-"baseline_cas redis memory"}
MODES=${MODES:-"new replay"}
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
MODULE=github.com/caddy-idempotency/caddy-idempotency
BASELINE_MODULE=github.com/caddy-idempotency/idem-baseline
PATH="$(go env GOPATH)/bin:$PATH"
command -v xcaddy >/dev/null 2>&1 || go install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
command -v redis-server >/dev/null 2>&1 || { echo "compare: redis-server is missing" >&2; exit 1; }

rm -rf "$out" && mkdir -p "$out"
(cd "$here" && go build -o "$out/loadgen" ./loadgen && go build -o "$out/upstream" ./upstream)
L=$out/loadgen

build() { # name, source directory
	(cd "$out" && xcaddy build "$CADDY_VERSION" --output "$out/caddy-$1" \
		--with "$MODULE@v0.0.0=$2" --replace "$MODULE=$2" \
		--with "$BASELINE_MODULE@v0.0.0=$here/baseline") >"$out/build-$1.log" 2>&1 ||
		{ tail -20 "$out/build-$1.log" >&2; exit 1; }
}
export_rev() { # rev, directory
	mkdir -p "$2" && (cd "$repo" && git archive "$1") | tar -x -C "$2"
}
echo "compare: building $old_rev and ${new_rev:-the working tree}" >&2
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
rp=$($L freeport)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no >"$out/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
"$out/upstream" -addr-file "$out/upstream.addr" >"$out/upstream.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/upstream.addr" ] && redis-cli -p "$rp" ping >/dev/null 2>&1 && break; sleep 0.05; done
up=$(cat "$out/upstream.addr")

# A private PostgreSQL, only when a postgres route is run. As root it runs as
# the postgres user, which PostgreSQL requires.
pg_pid="" pp=""
if [[ " $ROUTES " == *" postgres "* ]]; then
	pgbin=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
	pp=$($L freeport)
	pgdir=$out/pg && mkdir -p "$pgdir"
	as=()
	if [ "$(id -u)" -eq 0 ]; then chown postgres "$pgdir" && chmod 711 "$out" && as=(runuser -u postgres --); fi
	"${as[@]}" "$pgbin/initdb" -D "$pgdir/data" -U postgres -A trust -E UTF8 --locale=C -N >"$out/initdb.log" 2>&1
	"${as[@]}" "$pgbin/postgres" -D "$pgdir/data" -p "$pp" -k "$pgdir/data" -c listen_addresses=127.0.0.1 \
		-c fsync=off -c full_page_writes=off -c max_connections=300 >"$out/postgres.log" 2>&1 &
	pg_pid=$!
	pids+=("$pg_pid")
	for _ in $(seq 200); do "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pp" && break; sleep 0.05; done
fi

declare -A port pid
for b in old new; do
	ap=$($L freeport)
	port[$b]=$($L freeport)
	cat >"$out/Caddyfile.$b" <<CF
{
	admin 127.0.0.1:$ap
	auto_https off
	persist_config off
}
http://127.0.0.1:${port[$b]} {
	route /baseline_cas/* {
		idem_baseline {
			address 127.0.0.1:$rp
			key_prefix cas-$b:
			ttl 10m
			owner_check
		}
		reverse_proxy $up
	}
	route /memory/* {
		idempotency {
			ttl 10m
			store memory
		}
		reverse_proxy $up
	}
	route /redis/* {
		idempotency {
			ttl 10m
			store redis {
				address 127.0.0.1:$rp
				key_prefix idem-$b
			}
		}
		reverse_proxy $up
	}
	route /postgres/* {
		idempotency {
			ttl 10m
			store postgres {
				dsn "postgres://postgres@127.0.0.1:$pp/postgres?sslmode=disable"
				table idem_$b
			}
		}
		reverse_proxy $up
	}
	route /file/* {
		idempotency {
			ttl 10m
			store file {
				path $out/file-$b
			}
		}
		reverse_proxy $up
	}
	route /redis_cached/* {
		idempotency {
			ttl 10m
			store redis {
				address 127.0.0.1:$rp
				key_prefix cached-$b
				local_cache 64MiB
			}
		}
		reverse_proxy $up
	}
}
CF
	"$out/caddy-$b" run --config "$out/Caddyfile.$b" --adapter caddyfile >"$out/caddy-$b.log" 2>&1 &
	pid[$b]=$!
	pids+=("${pid[$b]}")
done
for b in old new; do
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:${port[$b]}/" && break; sleep 0.05; done
done

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; } # utime+stime
# The store server's ticks: Redis, or the postmaster with its backends
# (whose ticks, once they exit, are in the postmaster's cutime).
server_ticks() {
	if [ "$1" = postgres ]; then
		local t
		t=$(awk '{print $14+$15+$16+$17}' "/proc/$pg_pid/stat")
		for c in $(pgrep -P "$pg_pid"); do t=$((t + $(ticks "$c" 2>/dev/null || echo 0))); done
		echo "$t"
	elif [ "$1" = file ] || [ "$1" = memory ]; then
		echo 0
	else
		ticks "$redis_pid"
	fi
}
hz=$(getconf CLK_TCK)
runs=()
for m in $MODES; do for r in $ROUTES; do for b in old new; do runs+=("$m $r $b"); done; done; done
n=${#runs[@]}
: >"$out/results.txt"
for ((round = 0; round < ROUNDS; round++)); do
	echo "compare: round $((round + 1)) of $ROUNDS" >&2
	# the harness's order (a Williams design): every run follows every other equally often
	read -r -a order <<<"$("$L" order -n "$n" -round "$round")"
	for ((i = 0; i < n; i++)); do
		read -r m r b <<<"${runs[${order[i]}]}"
		url="http://127.0.0.1:${port[$b]}/$r/orders"
		"$L" run -url "$url" -mode "$m" -conc "$CONC" -warmup 300ms -duration 300ms >/dev/null
		c0=$(ticks "${pid[$b]}") s0=$(server_ticks "$r")
		"$L" run -url "$url" -mode "$m" -conc "$CONC" -warmup 0s -duration "$DUR" >"$out/last.json"
		c1=$(ticks "${pid[$b]}") s1=$(server_ticks "$r")
		python3 - "$m" "$r" "$b" "$round" "$c0" "$c1" "$s0" "$s1" "$hz" "$out/last.json" >>"$out/results.txt" <<'PY'
import json, sys
m, r, b, rnd, c0, c1, s0, s1, hz, f = sys.argv[1:]
d = json.load(open(f))
n = d["requests"]
us = lambda a, z: (int(z) - int(a)) / int(hz) * 1e6 / n
print(m, r, b, rnd, round(d["rps"]), round(us(c0, c1), 1), round(us(s0, s1), 1), round(d["p99_us"]), round(d["p50_us"]))
PY
	done
done

python3 - "$out/results.txt" "$old_rev" "${new_rev:-working tree}" "$CONC" <<'PY'
import collections, statistics as st, sys
path, old, new, conc = sys.argv[1:]
runs = collections.defaultdict(dict)  # (mode, route, build) -> round -> (rps, cpu, p99, p50)
for line in open(path):
    m, r, b, rnd, rps, caddy, redis, p99, p50 = line.split()
    runs[(m, r, b)][int(rnd)] = (float(rps), float(caddy) + float(redis), float(p99), float(p50))
print(f"old = {old}, new = {new}; concurrency {conc}; CPU is Caddy + its store server per request, medians over rounds")
print()
print("| mode | route | build | req/s | CPU µs/req | p50 µs | p99 µs |")
print("|---|---|---|---:|---:|---:|---:|")
for (m, r, b), v in sorted(runs.items()):
    col = lambda i: st.median(x[i] for x in v.values())
    print(f"| {m} | {r} | {b} | {col(0):.0f} | {col(1):.1f} | {col(3):.0f} | {col(2):.0f} |")
def paired(a, z, i):
    return st.median(a[k][i] / z[k][i] for k in a if k in z)
print()
print("| mode | comparison | CPU ratio | throughput ratio | p50 ratio |")
print("|---|---|---:|---:|---:|")
for m in sorted({k[0] for k in runs}):
    for r in sorted({k[1] for k in runs}):
        if (m, r, "old") in runs and (m, r, "new") in runs:
            o, n = runs[(m, r, "old")], runs[(m, r, "new")]
            print(f"| {m} | {r}: new / old | {paired(n, o, 1):.3f} | {paired(n, o, 0):.3f} | {paired(n, o, 3):.3f} |")
    for b in ("old", "new"):
        if (m, "redis", b) in runs and (m, "baseline_cas", b) in runs:
            a, c = runs[(m, "redis", b)], runs[(m, "baseline_cas", b)]
            print(f"| {m} | {b}: redis / baseline_cas | {paired(a, c, 1):.3f} | {paired(a, c, 0):.3f} | {paired(a, c, 3):.3f} |")
PY
