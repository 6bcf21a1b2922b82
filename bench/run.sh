#!/usr/bin/env bash
# Side-by-side benchmark of the idempotency handler (issue 5).
#
# Builds Caddy with this module and with a deliberately minimal baseline
# handler (bench/baseline), starts a private redis-server, an upstream and
# (when the store is in the build) a private PostgreSQL on loopback, serves
# one route per handler chain from one Caddy process, and drives them with
# bench/loadgen in alternating rounds. Writes BENCHMARKS.md and a PNG chart.
#
#   bench/run.sh            full run: writes bench/BENCHMARKS.md and bench/benchmarks.png
#   QUICK=1 bench/run.sh    smoke run (about a minute once Caddy is built):
#                           writes bench/out/quick/BENCHMARKS.md and its chart
#
# Environment (defaults for a full run; QUICK=1 changes the starred ones):
#   DURATION=1500ms    * measured time per run (one route, one case)
#   WARMUP=400ms       * unmeasured load before each run
#   ROUNDS=3           * rounds per case; every route runs once per round
#   CONCURRENCY="1 16 64 256" *
#   MODES="new replay mix"   new key every request; replay of one key; 50/50
#   REPLAY_KEYS=1      how many stored keys the replays ask for, worker w
#                      the (w mod REPLAY_KEYS)th: the handler holds a claim
#                      back while an earlier one of its key has been under
#                      way in the process for over 50ms, which a store call
#                      under heavy load takes, so with one key replays can
#                      queue behind each other; set it to the highest
#                      concurrency to replay keys in parallel
#   ROUTES=""          default: proxy baseline baseline_cas memory redis, plus
#                      redis_cached when the redis store accepts local_cache,
#                      postgres and baseline_pg when the postgres store is in
#                      the build and PostgreSQL starts, and file when its
#                      store is in the build.
#                      baseline_cas is the baseline with owner_check: its
#                      completion is a minimal owner-checked Lua script, the
#                      fair floor for the redis store (baseline's plain SET
#                      checks no ownership).
#                      baseline_pg (idem_baseline_pg) is the same floor for
#                      the postgres store, on the same private PostgreSQL
#                      (table idem_baseline_pg): one INSERT ... ON CONFLICT
#                      claim-or-read, one owner-checked UPDATE.
#                      redis_cached is the redis store with local_cache 64MiB.
#                      redis_unpipelined (not a default; name it in ROUTES)
#                      is the redis store with pipelining off.
#                      postgres_unpipelined (not a default; name it in
#                      ROUTES) is the postgres store with pipelining off,
#                      on the same server, table idem_unpipelined.
#   POSTGRES=1         0 skips the postgres and baseline_pg routes
#   PG_FSYNC=0         1: the private PostgreSQL runs with fsync and
#                      full_page_writes on (synchronous_commit is on either
#                      way), so every commit waits for its WAL flush, as a
#                      production server's does; 0 turns both off
#   FILESTORE=1        0 skips the file route
#   MEM=1              memory test: MEM_N concurrent 1 MiB responses through
#   MEM_N=500        * fresh Caddy processes, peak RSS from /proc (VmHWM)
#   PROFILE=0          1: 10 s CPU and allocation profiles of a fresh Caddy
#                      (same config, GODEBUG=memprofilerate=16384) under the
#                      PROFILE_ROUTE PROFILE_MODE load, into bench/out/<label>/
#   PROFILE_ROUTE=redis the route that load drives (any route of the run)
#   PROFILE_MODE=new   its key mode: new or replay
#   PROFILE_CONC=64    concurrency of that load
#   PG_STATS=0         1: the private PostgreSQL loads pg_stat_statements;
#                      per-statement calls, time, rows, buffers and WAL go to
#                      bench/out/<label>/pg-statements.txt after the load
#                      (every route's statements, told apart by table), and,
#                      when PROFILE_ROUTE is postgres or baseline_pg, to
#                      pg-statements-profile.txt for the profile load alone,
#                      with a perf profile of the PostgreSQL backends in
#                      pg-perf.txt when perf is installed
#   CADDY_VERSION=v2.11.9
#   OUT_MD, OUT_PNG    override where the report and chart go
#   LABEL              name of the bench/out/ subdirectory for this run's
#                      logs, raw results and profiles (default quick or full)
# Everything else (binaries, logs, raw JSON results, profiles) goes to
# bench/out/, which git ignores. The Caddy build is reused while the Go
# sources it is built from are unchanged.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=$here/out
mkdir -p "$out"

QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
	label=quick
	DURATION=${DURATION:-1s}
	WARMUP=${WARMUP:-300ms}
	ROUNDS=${ROUNDS:-1}
	CONCURRENCY=${CONCURRENCY:-"1 64"}
	MEM_N=${MEM_N:-100}
	OUT_MD=${OUT_MD:-$out/quick/BENCHMARKS.md}
	OUT_PNG=${OUT_PNG:-$out/quick/benchmarks.png}
else
	label=full
	DURATION=${DURATION:-1500ms}
	WARMUP=${WARMUP:-400ms}
	ROUNDS=${ROUNDS:-3}
	CONCURRENCY=${CONCURRENCY:-"1 16 64 256"}
	MEM_N=${MEM_N:-500}
	OUT_MD=${OUT_MD:-$here/BENCHMARKS.md}
	OUT_PNG=${OUT_PNG:-$here/benchmarks.png}
fi
MODES=${MODES:-"new replay mix"}
REPLAY_KEYS=${REPLAY_KEYS:-1}
ROUTES=${ROUTES:-}
POSTGRES=${POSTGRES:-1}
PG_FSYNC=${PG_FSYNC:-0}
FILESTORE=${FILESTORE:-1}
MEM=${MEM:-1}
PROFILE=${PROFILE:-0}
PROFILE_ROUTE=${PROFILE_ROUTE:-redis}
PROFILE_MODE=${PROFILE_MODE:-new}
PROFILE_CONC=${PROFILE_CONC:-64}
PG_STATS=${PG_STATS:-0}
CADDY_VERSION=${CADDY_VERSION:-v2.11.9}
XCADDY_VERSION=v0.4.5
MODULE=github.com/caddy-idempotency/caddy-idempotency
BASELINE_MODULE=github.com/caddy-idempotency/idem-baseline

label=${LABEL:-$label}
run=$out/$label
rm -rf "$run"
mkdir -p "$run" "$(dirname "$OUT_MD")" "$(dirname "$OUT_PNG")"
notes=$run/notes.md
: >"$notes"
started=$(date +%s)
note() { echo "- $*" >>"$notes"; echo "bench [$(($(date +%s) - started))s]: note: $*" >&2; }
say() { echo "bench [$(($(date +%s) - started))s]: $*" >&2; }

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ------------------------------------------------------------------ tools
if ! command -v redis-server >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		say "installing redis-server"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
	else
		echo "bench: redis-server is missing; install it (Redis 7 or newer)" >&2
		exit 1
	fi
fi
PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v xcaddy >/dev/null 2>&1; then
	say "installing xcaddy $XCADDY_VERSION"
	go install "github.com/caddyserver/xcaddy/cmd/xcaddy@$XCADDY_VERSION"
fi

say "building loadgen, upstream and report"
(cd "$here" && go build -o "$out/loadgen" ./loadgen && go build -o "$out/upstream" ./upstream && go build -o "$out/report" ./report)

# ------------------------------------------------------------------ caddy
# Stores outside the root package are built in only if they compile: other
# work may have them half done.
extra=()
for s in postgres file; do
	if [ -d "$repo/store/$s" ] && (cd "$repo" && go build "./store/$s" >/dev/null 2>&1); then
		extra+=(--with "$MODULE/store/$s")
	else
		note "store/$s does not build (or is missing); it is left out of the build"
	fi
done

hash=$( (
	echo "$CADDY_VERSION ${extra[*]:-}"
	cd "$repo" && find . -path ./bench/out -prune -o \( -name '*.go' -o -name go.mod -o -name go.sum \) -print |
		grep -v '_test\.go$' | LC_ALL=C sort | xargs sha256sum
) | sha256sum | cut -d' ' -f1)
if [ -x "$out/caddy" ] && [ "$(cat "$out/caddy.hash" 2>/dev/null)" = "$hash" ]; then
	say "reusing $out/caddy (sources unchanged)"
else
	say "building Caddy $CADDY_VERSION with the module, the baseline and $((${#extra[@]} / 2)) extra store package(s)"
	rm -f "$out/caddy.hash"
	# explicit versions with local replacements: nothing asks the module
	# proxy for these unpublished modules. The unversioned --replace also
	# makes xcaddy take the store packages (--with MODULE/store/x) from the
	# working tree instead of looking them up.
	(cd "$run" && xcaddy build "$CADDY_VERSION" --output "$out/caddy" \
		--with "$MODULE@v0.0.0=$repo" \
		--replace "$MODULE=$repo" \
		--with "$BASELINE_MODULE@v0.0.0=$here/baseline" \
		"${extra[@]}") >"$run/build.log" 2>&1 || {
		tail -30 "$run/build.log" >&2
		exit 1
	}
	echo "$hash" >"$out/caddy.hash"
fi
"$out/caddy" list-modules >"$run/modules.txt"
for m in http.handlers.idempotency http.handlers.idem_baseline http.handlers.idem_baseline_pg http.idempotency.stores.memory http.idempotency.stores.redis; do
	grep -qx "$m" "$run/modules.txt" || {
		echo "bench: $out/caddy lacks $m" >&2
		exit 1
	}
done
have_module() { grep -qx "http.idempotency.stores.$1" "$run/modules.txt"; }

# The redis store's local replay cache is being written elsewhere: the
# redis_cached route runs only when this build's Caddyfile adapter takes
# the option. caddy adapt provisions nothing, so no Redis is needed here.
has_local_cache() {
	printf 'http://127.0.0.1:1 {\n\troute {\n\t\tidempotency {\n\t\t\tstore redis {\n\t\t\t\taddress 127.0.0.1:1\n\t\t\t\tlocal_cache 64MiB\n\t\t\t}\n\t\t}\n\t}\n}\n' >"$run/Caddyfile.local_cache"
	"$out/caddy" adapt --config "$run/Caddyfile.local_cache" --adapter caddyfile >/dev/null 2>"$run/local_cache-probe.log"
}
has_route() { [[ " $ROUTES " == *" $1 "* ]]; }
drop_route() {
	local r kept=()
	for r in $ROUTES; do
		[ "$r" = "$1" ] || kept+=("$r")
	done
	ROUTES="${kept[*]:-}"
}

# ------------------------------------------------------------------ processes
pids=()
pgtmp=""
pg_pid=""
cleanup() {
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		if [ "${pids[$i]}" = "$pg_pid" ]; then
			kill -INT "$pg_pid" 2>/dev/null || true # fast shutdown
		else
			kill "${pids[$i]}" 2>/dev/null || true
		fi
	done
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		wait "${pids[$i]}" 2>/dev/null || true
	done
	if [ -n "$pgtmp" ]; then
		rm -rf "$pgtmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

freeport() { "$out/loadgen" freeport; }
wait_for() { # description, tries (x 50ms), command...
	local what=$1 tries=$2
	shift 2
	for ((i = 0; i < tries; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.05
	done
	echo "bench: $what did not come up" >&2
	return 1
}

redis_port=$(freeport)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
	--daemonize no --logfile "$run/redis.log" --dir "$run" &
redis_pid=$!
pids+=("$redis_pid")
wait_for redis-server 100 redis-cli -p "$redis_port" ping
redis_addr=127.0.0.1:$redis_port

"$out/upstream" -addr-file "$run/upstream.addr" 2>"$run/upstream.log" &
upstream_pid=$!
pids+=("$upstream_pid")
wait_for upstream 100 test -s "$run/upstream.addr"
upstream=$(cat "$run/upstream.addr")

# A private PostgreSQL in a temporary directory. It refuses to run as
# root, so as root it runs as the postgres user (setpriv execs, so $! is
# the postmaster itself).
pg_dsn=""
start_postgres() {
	local initdb_bin
	initdb_bin=$(command -v initdb 2>/dev/null || true)
	if [ -z "$initdb_bin" ]; then
		initdb_bin=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1 || true)
	fi
	if [ -z "$initdb_bin" ]; then
		note "postgres route skipped: initdb not found (install postgresql)"
		return 1
	fi
	pg_bin=$(dirname "$(readlink -f "$initdb_bin")")
	[ -x "$pg_bin/postgres" ] || { note "postgres route skipped: no postgres beside $initdb_bin"; return 1; }
	local as=()
	pgtmp=$(mktemp -d /tmp/idem-bench-pg.XXXXXX)
	mkdir "$pgtmp/data"
	if [ "$(id -u)" = 0 ]; then
		if ! id postgres >/dev/null 2>&1; then
			note "postgres route skipped: running as root and there is no postgres user to run the server as"
			return 1
		fi
		chmod 711 "$pgtmp"
		chown postgres: "$pgtmp/data"
		as=(setpriv --reuid postgres --regid postgres --clear-groups)
	fi
	chmod 700 "$pgtmp/data"
	if ! "${as[@]}" "$pg_bin/initdb" -D "$pgtmp/data" -U postgres -A trust -E UTF8 --locale=C -N >"$run/initdb.log" 2>&1; then
		note "postgres route skipped: initdb failed (see bench/out/$label/initdb.log)"
		return 1
	fi
	local port stats=() durability=(-c fsync=off -c full_page_writes=off)
	port=$(freeport)
	if [ "$PG_FSYNC" = 1 ]; then
		durability=(-c fsync=on -c full_page_writes=on -c synchronous_commit=on)
	fi
	if [ "$PG_STATS" = 1 ]; then
		stats=(-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top -c track_io_timing=on)
	fi
	(cd "$pgtmp" && exec "${as[@]}" "$pg_bin/postgres" -D "$pgtmp/data" -p "$port" -k "$pgtmp/data" \
		-c listen_addresses=127.0.0.1 "${durability[@]}" -c max_connections=300 "${stats[@]}" \
		>"$run/postgres.log" 2>&1) &
	pg_pid=$!
	pids+=("$pg_pid")
	if ! wait_for postgres 400 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"; then
		note "postgres route skipped: the server did not start (see bench/out/$label/postgres.log)"
		pg_pid=""
		return 1
	fi
	sleep 0.5 # accepting TCP slightly precedes accepting sessions
	pg_dsn="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	if [ "$PG_STATS" = 1 ]; then
		pg_sql "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
	fi
}
pg_bin=""
pg_sql() { "$pg_bin/psql" "$pg_dsn" -X -q -v ON_ERROR_STOP=1 -c "$@"; }
# pg_statements writes what pg_stat_statements holds, per call, to $1.
pg_statements() {
	pg_sql "SELECT calls, round((total_exec_time / calls * 1000)::numeric, 1) AS exec_us,
		round((rows::float8 / calls)::numeric, 2) AS rows, round((shared_blks_hit::float8 / calls)::numeric, 1) AS hit,
		round((shared_blks_dirtied::float8 / calls)::numeric, 2) AS dirtied, round((wal_records::float8 / calls)::numeric, 2) AS wal_recs,
		round((wal_bytes / calls)::numeric) AS wal_bytes, regexp_replace(query, '\s+', ' ', 'g') AS query
		FROM pg_stat_statements WHERE calls > 100 ORDER BY total_exec_time DESC" >"$1"
}

if [ -z "$ROUTES" ]; then
	ROUTES="proxy baseline baseline_cas memory redis"
	if has_local_cache; then
		ROUTES="$ROUTES redis_cached"
	else
		note "no redis_cached route: this build's redis store does not take local_cache (see bench/out/$label/local_cache-probe.log)"
	fi
	if have_module postgres; then
		if [ "$POSTGRES" = 1 ]; then
			start_postgres && ROUTES="$ROUTES postgres baseline_pg" || true
		else
			note "postgres and baseline_pg routes skipped (POSTGRES=0)"
		fi
	else
		note "no postgres or baseline_pg route: http.idempotency.stores.postgres is not in the build"
	fi
	if have_module file; then
		if [ "$FILESTORE" = 1 ]; then
			ROUTES="$ROUTES file"
		else
			note "file route skipped (FILESTORE=0)"
		fi
	else
		note "no file route: http.idempotency.stores.file is not in the build"
	fi
else
	if has_route postgres && ! have_module postgres; then
		note "postgres route skipped: http.idempotency.stores.postgres is not in the build"
		drop_route postgres
	fi
	if has_route postgres_unpipelined && ! have_module postgres; then
		note "postgres_unpipelined route skipped: http.idempotency.stores.postgres is not in the build"
		drop_route postgres_unpipelined
	fi
	if has_route postgres || has_route baseline_pg || has_route postgres_unpipelined; then
		start_postgres || {
			drop_route postgres
			drop_route baseline_pg
			drop_route postgres_unpipelined
		}
	fi
	if has_route redis_cached && ! has_local_cache; then
		note "redis_cached route skipped: this build's redis store does not take local_cache (see bench/out/$label/local_cache-probe.log)"
		drop_route redis_cached
	fi
fi

mkdir -p "$run/filestore"
caddy_port=$(freeport)
admin_port=$(freeport)
route_block() { # name
	case $1 in
	proxy) printf '\troute /proxy/* {\n\t\treverse_proxy %s\n\t}\n' "$upstream" ;;
	baseline) printf '\troute /baseline/* {\n\t\tidem_baseline {\n\t\t\taddress %s\n\t\t\tttl 10m\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$redis_addr" "$upstream" ;;
	baseline_cas) printf '\troute /baseline_cas/* {\n\t\tidem_baseline {\n\t\t\taddress %s\n\t\t\tkey_prefix idem_baseline_cas:\n\t\t\tttl 10m\n\t\t\towner_check\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$redis_addr" "$upstream" ;;
	memory) printf '\troute /memory/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore memory\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$upstream" ;;
	redis) printf '\troute /redis/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$redis_addr" "$upstream" ;;
	redis_unpipelined) printf '\troute /redis_unpipelined/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t\tkey_prefix unpipelined\n\t\t\t\tpipelining off\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$redis_addr" "$upstream" ;;
	redis_cached) printf '\troute /redis_cached/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t\tlocal_cache 64MiB\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$redis_addr" "$upstream" ;;
	postgres) printf '\troute /postgres/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore postgres {\n\t\t\t\tdsn "%s"\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$pg_dsn" "$upstream" ;;
	postgres_unpipelined) printf '\troute /postgres_unpipelined/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore postgres {\n\t\t\t\tdsn "%s"\n\t\t\t\ttable idem_unpipelined\n\t\t\t\tpipelining off\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$pg_dsn" "$upstream" ;;
	baseline_pg) printf '\troute /baseline_pg/* {\n\t\tidem_baseline_pg {\n\t\t\tdsn "%s"\n\t\t\ttable idem_baseline_pg\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$pg_dsn" "$upstream" ;;
	file) printf '\troute /file/* {\n\t\tidempotency {\n\t\t\tttl 10m\n\t\t\tstore file {\n\t\t\t\tpath %s\n\t\t\t}\n\t\t}\n\t\treverse_proxy %s\n\t}\n' "$run/filestore" "$upstream" ;;
	*)
		echo "bench: unknown route $1" >&2
		exit 1
		;;
	esac
}
caddyfile() { # port admin_port routes...
	local port=$1 admin=$2
	shift 2
	printf '{\n\tadmin 127.0.0.1:%s\n\tauto_https off\n\tpersist_config off\n}\n\nhttp://127.0.0.1:%s {\n' "$admin" "$port"
	for r in "$@"; do route_block "$r"; done
	printf '}\n'
}
start_caddy() { # config file, log file, admin port; sets caddy_pid. CADDY_GODEBUG sets GODEBUG.
	GODEBUG=${CADDY_GODEBUG:-${GODEBUG:-}} "$out/caddy" run --config "$1" --adapter caddyfile >"$2" 2>&1 &
	caddy_pid=$!
	pids+=("$caddy_pid")
	wait_for "caddy ($1)" 400 curl -sf "http://127.0.0.1:$3/config/" || {
		tail -20 "$2" >&2
		exit 1
	}
}
stop_caddy() {
	kill "$caddy_pid" 2>/dev/null || true
	wait "$caddy_pid" 2>/dev/null || true
	local keep=() p
	for p in "${pids[@]}"; do
		[ "$p" = "$caddy_pid" ] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

# shellcheck disable=SC2086
caddyfile "$caddy_port" "$admin_port" $ROUTES >"$run/Caddyfile"
start_caddy "$run/Caddyfile" "$run/caddy.log" "$admin_port"
base=http://127.0.0.1:$caddy_port
for r in $ROUTES; do
	code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Idempotency-Key: probe-$r" -d '{}' "$base/$r/orders")
	if [ "$code" != 201 ]; then
		echo "bench: probe of route $r answered $code, not 201; see $run/caddy.log" >&2
		exit 1
	fi
done

# ------------------------------------------------------------------ machine
{
	echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "cores (nproc)=$(nproc)"
	echo "memory=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "kernel=$(uname -sr)"
	echo "Go=$(go version | cut -d' ' -f3-)"
	echo "Caddy=$("$out/caddy" version | cut -d' ' -f1)"
	echo "Redis=$(redis-server --version | grep -o 'v=[^ ]*' | cut -d= -f2)"
	if [ -n "$pg_pid" ]; then
		echo "PostgreSQL=$("$(dirname "$(readlink -f /proc/"$pg_pid"/exe)")/postgres" --version | awk '{print $3}')"
		if [ "$PG_FSYNC" = 1 ]; then
			echo "PostgreSQL durability=fsync on, full_page_writes on, synchronous_commit on (PG_FSYNC=1)"
		else
			echo "PostgreSQL durability=fsync off, full_page_writes off (PG_FSYNC=0)"
		fi
	fi
	echo "load average at start=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$run/machine.txt"

cpu_pids="caddy=$caddy_pid,redis=$redis_pid"
[ -n "$pg_pid" ] && cpu_pids="$cpu_pids,postgres=$pg_pid"

# ------------------------------------------------------------------ load
say "routes: $ROUTES; modes: $MODES; concurrency: $CONCURRENCY; $ROUNDS round(s) of $DURATION (+$WARMUP warm-up)"
"$out/loadgen" bench -base "$base" -routes "${ROUTES// /,}" -modes "${MODES// /,}" -conc "${CONCURRENCY// /,}" \
	-duration "$DURATION" -warmup "$WARMUP" -rounds "$ROUNDS" -replay-keys "$REPLAY_KEYS" -pids "$cpu_pids" -other-pids "upstream=$upstream_pid" -clk-tck "$(getconf CLK_TCK)" \
	-redis "$redis_addr" -upstream "$upstream" -out "$run/results.jsonl"

echo "load average at end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$run/machine.txt"
stop_caddy
if [ "$PG_STATS" = 1 ] && [ -n "$pg_pid" ]; then
	pg_statements "$run/pg-statements.txt"
	say "per-statement PostgreSQL figures in $run/pg-statements.txt"
fi

profiles=""
if [ "$PROFILE" = 1 ]; then
	# A fresh Caddy with the same config, so the profiles hold nothing of the
	# other routes, sampling allocations every 16 KiB instead of 512 KiB so
	# that a 10 s delta holds enough samples to rank the handler's own.
	has_route "$PROFILE_ROUTE" || { echo "bench: PROFILE_ROUTE $PROFILE_ROUTE is not among the routes ($ROUTES)" >&2; exit 1; }
	say "profiling a fresh Caddy under the $PROFILE_ROUTE $PROFILE_MODE-key load (c=$PROFILE_CONC)"
	CADDY_GODEBUG=memprofilerate=16384 start_caddy "$run/Caddyfile" "$run/caddy.profile.log" "$admin_port"
	pg_profile=0
	if [ "$PG_STATS" = 1 ] && [ -n "$pg_pid" ] && [[ $PROFILE_ROUTE == postgres || $PROFILE_ROUTE == baseline_pg ]]; then
		pg_profile=1
	fi
	"$out/loadgen" run -url "$base/$PROFILE_ROUTE/orders" -mode "$PROFILE_MODE" -conc "$PROFILE_CONC" -replay-keys "$REPLAY_KEYS" -warmup 1s -duration 12s >"$run/profile-load.json" &
	load_pid=$!
	sleep 1.5
	perf_pid=""
	if [ "$pg_profile" = 1 ]; then
		pg_sql "SELECT pg_stat_statements_reset()" >/dev/null
		# The backends that serve Caddy's pools exist by now; other children
		# of the postmaster (autovacuum workers) come and go.
		backends=$(pg_sql "SELECT string_agg(pid::text, ',') FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" -t -A || true)
		if command -v perf >/dev/null 2>&1 && [ -n "$backends" ]; then
			perf record -F 997 -g -p "$backends" -o "$run/pg-perf.data" -- sleep 10 >"$run/pg-perf.log" 2>&1 &
			perf_pid=$!
		fi
	fi
	curl -sf -o "$run/cpu.pprof" "http://127.0.0.1:$admin_port/debug/pprof/profile?seconds=10" &
	cpu_curl=$!
	curl -sf -o "$run/allocs.pprof" "http://127.0.0.1:$admin_port/debug/pprof/allocs?seconds=10"
	wait "$cpu_curl"
	if [ "$pg_profile" = 1 ]; then
		pg_statements "$run/pg-statements-profile.txt"
	fi
	if [ -n "$perf_pid" ]; then
		wait "$perf_pid" || true
		perf report -i "$run/pg-perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep -v '^$' | head -150 >"$run/pg-perf.txt" || true
	fi
	wait "$load_pid"
	stop_caddy
	cp "$out/caddy" "$run/caddy.bin" # the binary the profiles symbolize against
	mod='caddy-idempotency/caddy-idempotency'
	pp() { go tool pprof "$@" "$run/caddy.bin" 2>/dev/null; }
	pp -top -nodecount=25 "$run/cpu.pprof" >"$run/cpu-top.txt"
	pp -top -cum -nodecount=30 -focus="$mod" "$run/cpu.pprof" >"$run/cpu-cum-handler.txt"
	pp -peek "$mod"'\.\(\*Handler\)\.(ServeHTTP|execute|finish)$' "$run/cpu.pprof" >"$run/cpu-peek-handler.txt"
	pp -top -sample_index=alloc_space -nodecount=20 "$run/allocs.pprof" >"$run/alloc-space-top.txt"
	pp -top -sample_index=alloc_objects -nodecount=20 "$run/allocs.pprof" >"$run/alloc-objects-top.txt"
	pp -top -sample_index=alloc_objects -nodecount=25 -focus="$mod" "$run/allocs.pprof" >"$run/alloc-objects-handler.txt"
	profiles="CPU, flat (top 25)=$run/cpu-top.txt;CPU, cumulative, stacks through the idempotency module=$run/cpu-cum-handler.txt"
	profiles+=";CPU of the handler by callee (pprof -peek)=$run/cpu-peek-handler.txt"
	profiles+=";Allocated bytes (top 20)=$run/alloc-space-top.txt;Allocated objects (top 20)=$run/alloc-objects-top.txt"
	profiles+=";Allocated objects, stacks through the idempotency module=$run/alloc-objects-handler.txt"
	say "profiles in $run (cpu.pprof, allocs.pprof, *-top.txt)"
fi

# ------------------------------------------------------------------ memory
mem_arg=()
if [ "$MEM" = 1 ]; then
	say "memory test: $MEM_N concurrent 1 MiB responses, fresh Caddy per variant"
	mem_variant() { # label route-name extra-idempotency-options...
		local lbl=$1 name=$2 block=$3 port admin
		port=$(freeport)
		admin=$(freeport)
		printf '{\n\tadmin 127.0.0.1:%s\n\tauto_https off\n\tpersist_config off\n}\n\nhttp://127.0.0.1:%s {\n\troute /%s/* {\n%s\n\t\treverse_proxy %s\n\t}\n}\n' \
			"$admin" "$port" "$name" "$block" "$upstream" >"$run/Caddyfile.$name"
		redis-cli -p "$redis_port" flushall >/dev/null
		start_caddy "$run/Caddyfile.$name" "$run/caddy.$name.log" "$admin"
		sleep 0.3
		"$out/loadgen" mem -url "http://127.0.0.1:$port/$name/big" -n "$MEM_N" -pid "$caddy_pid" -label "$lbl" >>"$run/mem.jsonl"
		stop_caddy
	}
	mem_variant "reverse_proxy only" proxy ""
	mem_variant "idem_baseline (buffers every response)" baseline "$(printf '\t\tidem_baseline {\n\t\t\taddress %s\n\t\t}' "$redis_addr")"
	mem_variant "idempotency + redis, max_response_body 1MiB" redis1m "$(printf '\t\tidempotency {\n\t\t\tmax_response_body 1MiB\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t}\n\t\t}' "$redis_addr")"
	mem_variant "idempotency + redis (pool_size 512, read/write_timeout 10s), max_response_body 1MiB" redis1mpool "$(printf '\t\tidempotency {\n\t\t\tmax_response_body 1MiB\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t\tpool_size 512\n\t\t\t\tread_timeout 10s\n\t\t\t\twrite_timeout 10s\n\t\t\t}\n\t\t}' "$redis_addr")"
	mem_variant "idempotency + redis, max_response_body 64KiB" redis64k "$(printf '\t\tidempotency {\n\t\t\tmax_response_body 64KiB\n\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t}\n\t\t}' "$redis_addr")"
	mem_variant "idempotency + memory store (max_bytes 256MiB), max_response_body 1MiB" memory1m "$(printf '\t\tidempotency {\n\t\t\tmax_response_body 1MiB\n\t\t\tstore memory\n\t\t}')"
	mem_arg=(-mem "$run/mem.jsonl")
fi

# ------------------------------------------------------------------ report
elapsed=$(($(date +%s) - started))
settings="$label run, ${DURATION} measured (+${WARMUP} warm-up) per run, ${ROUNDS} round(s), concurrency ${CONCURRENCY}, modes ${MODES}, replays over ${REPLAY_KEYS} stored key(s); idempotency, baseline and baseline_cas with ttl 10m (baseline_pg keeps records without expiry), other options default; Redis FLUSHALL before each case; ${elapsed}s wall time before the report"
prof_arg=()
[ -n "$profiles" ] && prof_arg=(-profiles "$profiles")
OUT_MD=$(realpath -m "$OUT_MD")
OUT_PNG=$(realpath -m "$OUT_PNG")
(cd "$repo" && "$out/report" -results "$run/results.jsonl" -run-dir "bench/out/$label" "${mem_arg[@]}" "${prof_arg[@]}" \
	-machine "$run/machine.txt" -notes "$notes" -settings "$settings" -out "$OUT_MD" -png "$OUT_PNG")
say "wrote $OUT_MD and $OUT_PNG in $(($(date +%s) - started))s"
