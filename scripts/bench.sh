#!/usr/bin/env bash
# The load benchmark of docs/benchmarks.md: one server (api role) driven
# over HTTP by tools/loadbench, and pgbench on the same database in the
# same run:
#
#   (a) sites.get at a fixed concurrency against pgbench select-only, on
#       the dev PostgreSQL (scripts/devdb.sh: fsync off; reads do not
#       flush);
#   (b) secrets.put against pgbench running the statements one secrets.put
#       commits (scripts/bench/secrets_put.sql), both on a durable cluster:
#       fsync and synchronous_commit on, group commit settings stated in
#       the figures. The script starts that cluster (initdb in a temporary
#       directory, removed at the end) unless DURABLE_DATABASE_URL names
#       one;
#   (c) open-loop runs (a fixed arrival rate) at half the peaks of (a) and
#       (b) and at 150 % with shedding on and off.
#
# With PIN=1 (the default on two cores or more) the load generators
# (loadbench, pgbench) run on the last core and the server and PostgreSQL
# on the others (taskset). It writes the figures and the ratios to
# docs/benchmarks.md (OUT).
#
#   scripts/bench.sh            # 32 clients, 10 s per run
#   CLIENTS=64 BENCH_SECONDS=20 scripts/bench.sh
#   PIN=0 scripts/bench.sh      # nothing pinned
#   COMMIT_DELAY=50 COMMIT_SIBLINGS=5 scripts/bench.sh   # group commit on the durable cluster
#   NOTIFIER_BENCH=1 scripts/bench.sh   # and the notifier section at the end
#   WEBHOOK_BENCH=0 scripts/bench.sh    # without the webhook section
#
# Section (c) alone (ONLY=shed: no (a), (b), notifier or webhook runs; the
# figures go to OUT, by default a temporary file printed at the end):
#
#   ONLY=shed scripts/bench.sh                          # both methods
#   ONLY=shed SHED_METHODS=sites.get scripts/bench.sh   # sites.get only
#   ONLY=shed READ_PEAK=9000 PUT_PEAK=1100 scripts/bench.sh   # no search: these peaks
#   COMPUTED=/tmp/computed-base ONLY=shed ... # another build of the server (A/B)
#   RAW_DIR=/tmp/raw ONLY=shed ...   # keep each loadbench JSON (the search's steps),
#                                    # the half-load runs' timelines and the server's log
#   SHED_CONFIG='admission: {adaptive: true, maxQueueMs: 100}' ONLY=shed ...   # another "shedding on" (here the one before 2026-11-29)
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-32}
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
ONLY=${ONLY:-}
SHED_METHODS=${SHED_METHODS:-sites.get secrets.put}
COMMIT_DELAY=${COMMIT_DELAY:-0}       # microseconds (PostgreSQL's default: 0)
COMMIT_SIBLINGS=${COMMIT_SIBLINGS:-5} # PostgreSQL's default
work=$(mktemp -d)
if [[ $ONLY == shed ]]; then OUT=${OUT:-$work/bench.md}; else OUT=${OUT:-docs/benchmarks.md}; fi
if [[ $ONLY != "" && $ONLY != shed ]]; then echo "ONLY=$ONLY: only ONLY=shed is known" >&2; exit 2; fi
shed_runs() { [[ " $SHED_METHODS " == *" $1 "* ]]; } # whether (c) runs method $1
keep() { # name json: keeps a loadbench result under RAW_DIR, prints it
	if [[ -n "${RAW_DIR:-}" ]]; then mkdir -p "$RAW_DIR" && printf '%s\n' "$2" >"$RAW_DIR/$1.json"; fi
	printf '%s\n' "$2"
}
bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | sort -V | tail -n1)")
durable_dir=""
dev_postmaster=""

as_pg() { if [[ "$(id -u)" == 0 ]]; then (cd / && runuser -u postgres -- "$@"); else (cd / && "$@"); fi; }
servers=() # every computed started, stopped at exit whatever happened
cleanup() {
	for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${servers[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [[ -n "$durable_dir" ]]; then
		as_pg "$bin/pg_ctl" stop -D "$durable_dir/data" -m fast -w -s >/dev/null 2>&1 || true
		rm -rf "$durable_dir"
	fi
	if [[ -n "$dev_postmaster" ]]; then
		for pid in "$dev_postmaster" $(pgrep -P "$dev_postmaster"); do taskset -a -cp "0-$(($(nproc) - 1))" "$pid" >/dev/null 2>&1 || true; done
	fi
	if [[ -n "${RAW_DIR:-}" && -f "$work/server.log" ]]; then cp "$work/server.log" "$RAW_DIR/server.log"; fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT # an untrapped signal ends bash without its EXIT trap
trap 'exit 143' TERM

# Pinning: generators on the last core, server and PostgreSQL on the rest.
ncpu=$(nproc)
if [[ -z "${PIN:-}" ]]; then
	PIN=0
	if ((ncpu >= 2)) && command -v taskset >/dev/null; then PIN=1; fi
fi
if [[ $PIN == 1 ]]; then
	server_cpus="0-$((ncpu - 2))"
	gen_cpus="$((ncpu - 1))"
	on_server() { taskset -c "$server_cpus" "$@"; }
	on_gen() { taskset -c "$gen_cpus" "$@"; }
	pinning="pinned with taskset: loadbench and pgbench on core $gen_cpus, the server and PostgreSQL on core(s) $server_cpus"
else
	on_server() { "$@"; }
	on_gen() { "$@"; }
	pinning="not pinned: load generator, server and PostgreSQL share the $ncpu cores"
fi
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# With autogroup on, each session (the server's, each PostgreSQL cluster's
# pg_ctl, each other shell's) shares the CPU as one group and nice works
# only within a group: a niced build in another session still takes its
# group's share and runs whole slices on the server's core.
case "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" in
1) autogroup="autogroup on (kernel.sched_autogroup_enabled 1: each session one group; nice works only within a session)" ;;
0) autogroup="autogroup off (kernel.sched_autogroup_enabled 0: threads share the CPU by their nice values)" ;;
*) autogroup="no autogroup setting" ;;
esac

base_url=$(scripts/devdb.sh start)
psql_url() { local u=$1; shift; "$bin/psql" "$u" -v ON_ERROR_STOP=1 -qAt "$@"; }
psql_url "$base_url" -c "DROP DATABASE IF EXISTS computeplane_bench WITH (FORCE)" -c "CREATE DATABASE computeplane_bench"
db_url=${base_url/\/postgres\?/\/computeplane_bench?}
export SERVICE_DATABASE_URL=$db_url # the go benchmarks at the end
if [[ $PIN == 1 ]]; then
	# New backends fork from the postmaster and inherit its affinity.
	dev_postmaster=$(as_pg head -n1 "$(psql_url "$base_url" -c 'show data_directory')/postmaster.pid")
	taskset -a -cp "$server_cpus" "$dev_postmaster" >/dev/null
fi

# The durable cluster: fsync and synchronous_commit on, PostgreSQL's
# defaults otherwise but for the group commit settings named above.
if [[ -n "${DURABLE_DATABASE_URL:-}" ]]; then
	durable_base=$DURABLE_DATABASE_URL
else
	durable_dir=$(mktemp -d /tmp/computeplane-durable.XXXXXX)
	chmod 0755 "$durable_dir"
	mkdir -p "$durable_dir/data" "$durable_dir/run"
	touch "$durable_dir/log"
	if [[ "$(id -u)" == 0 ]]; then chown postgres: "$durable_dir/data" "$durable_dir/run" "$durable_dir/log"; fi
	as_pg "$bin/initdb" -D "$durable_dir/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
	durable_port=$((40000 + RANDOM % 20000))
	printf '%s\n' "listen_addresses = ''" "port = $durable_port" "unix_socket_directories = '$durable_dir/run'" \
		"max_connections = 200" "shared_buffers = 128MB" "fsync = on" "synchronous_commit = on" "full_page_writes = on" \
		"commit_delay = $COMMIT_DELAY" "commit_siblings = $COMMIT_SIBLINGS" | as_pg tee -a "$durable_dir/data/postgresql.conf" >/dev/null
	(
		# Only stdin, stdout and stderr: a server that inherited a pipe
		# would keep the caller waiting.
		for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; if ((fd > 2)); then eval "exec $fd>&-"; fi; done
		as_user=()
		if [[ "$(id -u)" == 0 ]]; then as_user=(runuser -u postgres --); fi
		cd / && on_server "${as_user[@]}" "$bin/pg_ctl" start -D "$durable_dir/data" -l "$durable_dir/log" -w -t 60 -s
	)
	durable_base="postgres://postgres@/postgres?host=$durable_dir/run&port=$durable_port&sslmode=disable"
fi
psql_url "$durable_base" -c "DROP DATABASE IF EXISTS computeplane_bench WITH (FORCE)" -c "CREATE DATABASE computeplane_bench"
durable_url=${durable_base/\/postgres\?/\/computeplane_bench?}
durable_settings=$(psql_url "$durable_url" -F' ' -c "select name, setting, coalesce(unit, '') from pg_settings where name in
	('fsync','synchronous_commit','full_page_writes','wal_sync_method','commit_delay','commit_siblings','wal_writer_delay','wal_writer_flush_after') order by name" |
	awk '{u=$3; if (u=="8kB") {printf "%s %d kB, ", $1, $2*8} else {printf "%s %s%s, ", $1, $2, (u==""?"":" " u)}}' | sed 's/, $//')

export SERVICE_SECRET=${SERVICE_SECRET:-bench-secret-0123456789abcdefghijklmnopqrstuvwxyz}
if [[ -n "${COMPUTED:-}" ]]; then cp "$COMPUTED" "$work/computed"; else go build -o "$work/computed" ./cmd/computed; fi
go build -o "$work/loadbench" ./tools/loadbench
SERVICE_DATABASE_URL=$db_url "$work/computed" migrate
SERVICE_DATABASE_URL=$durable_url "$work/computed" migrate
token=$(SERVICE_DATABASE_URL=$db_url "$work/computed" iam create-key --tenant bench --identity bench --role owner | tail -n1)
dtoken=$(SERVICE_DATABASE_URL=$durable_url "$work/computed" iam create-key --tenant bench --identity bench --role owner | tail -n1)

start_server() { # $1: database URL, $2: SERVICE_CONFIG (empty: none)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	# Not on_server: a function run with & is a subshell, and $! its pid,
	# not the server's; killing it left computed running. taskset execs
	# the server, so $! is computed itself.
	local pin=()
	if [[ $PIN == 1 ]]; then pin=(taskset -c "$server_cpus"); fi
	SERVICE_DATABASE_URL=$1 SERVICE_CONFIG=${2:-} HOST=127.0.0.1 PORT=$port SERVICE_ROLES=api SERVICE_PPROF_ADDR=${PPROF_ADDR:-} \
		"${pin[@]}" "$work/computed" >>"$work/server.out" 2>>"$work/server.log" &
	server_pid=$!
	servers+=("$server_pid")
	api="http://127.0.0.1:$port/api/compute"
	for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
}
stop_server() { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }

run_rpc() { on_gen "$work/loadbench" -url "$api" -token "$cur_token" -tenant bench -c "$CLIENTS" -d "${SECONDS_PER_RUN}s" "$@"; }
run_open() { on_gen "$work/loadbench" -url "$api" -token "$cur_token" -tenant bench -d "${SECONDS_PER_RUN}s" "$@"; }
run_pgbench() { # $1: database URL, then pgbench's; prints: tps p50_ms p99_ms
	local url=$1
	shift
	on_gen "$bin/pgbench" -n -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" -r -l --log-prefix="$work/pgb" "$@" "$url" >"$work/pgbench.out" 2>&1
	tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.out" | tail -n1)
	cat "$work"/pgb.* | awk '{print $3}' | sort -n >"$work/lat"
	n=$(wc -l <"$work/lat")
	p50=$(awk -v n="$n" 'NR==int(n*0.50)+1{printf "%.3f", $1/1000}' "$work/lat")
	p99=$(awk -v n="$n" 'NR==int(n*0.99)+1{printf "%.3f", $1/1000}' "$work/lat")
	rm -f "$work"/pgb.*
	echo "$tps $p50 $p99"
}
json() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d.get('$2', 0))" "$1"; }

if [[ -n "${PROFILE_DIR:-}" ]]; then # profile each API run (go tool pprof)
	mkdir -p "$PROFILE_DIR"
	profile() { curl -fs "http://${PPROF_ADDR}/debug/pprof/profile?seconds=$((SECONDS_PER_RUN - 1))" -o "$PROFILE_DIR/$1.pprof" & }
else
	profile() { :; }
fi

# Round trips per call of the fleet's creates, counted on the wire by the
# tests that hold them (scripts/roundtrips.sh: real computed and
# compute-agent processes, one VM boot); before the timed runs, since it
# builds and starts processes, then a wait for a quiet machine.
if [[ $ONLY != shed ]]; then
	roundtrips=$(scripts/roundtrips.sh)
	scripts/settle.sh
fi

load_top=$(loadavg)
# (a) Reads on the dev cluster.
start_server "$db_url"
cur_token=$token
site=$(curl -fs -X POST "$api/sites/create" -H 'X-Service: 1' -H 'Content-Type: application/json' \
	-H "Authorization: Bearer $token" \
	-d '{"tenantId":"bench","kind":"custom","region":"eu-west","idempotencyKey":"bench-site"}' |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["siteId"])')
if [[ $ONLY == shed ]]; then # (c) alone
	stop_server
	: >"$OUT"
else
profile sites.get
read_rpc=$(run_rpc -method sites.get -site "$site")
stop_server
"$bin/pgbench" -i -q -s 10 "$db_url" >/dev/null 2>&1
read -r sel_tps sel_p50 sel_p99 < <(run_pgbench "$db_url" -S)

# (b) Mutations on the durable cluster. The API run creates the 64
# secrets the pgbench script updates.
start_server "$durable_url"
cur_token=$dtoken
profile secrets.put
put_rpc=$(run_rpc -method secrets.put)
stop_server
read -r put_tps put_p50 put_p99 < <(run_pgbench "$durable_url" -f scripts/bench/secrets_put.sql)

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
read_ratio=$(ratio "$(json "$read_rpc" perSecond)" "$sel_tps")
put_ratio=$(ratio "$(json "$put_rpc" perSecond)" "$put_tps")

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
mem=$(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo)
pgver=$("$bin/postgres" --version)
{
	cat <<MD
# Benchmarks

Written by \`make bench\` (scripts/bench.sh) on $(date -u +%Y-%m-%d). Each row is
one run of ${SECONDS_PER_RUN} s at ${CLIENTS} concurrent clients after a 2 s warm-up, on one
machine: $ncpu cores ($cpu), $mem, $pgver, $(go version | cut -d' ' -f3).
The server runs the api role alone; the load generator (tools/loadbench) calls
it through the generated client over HTTP on loopback; pgbench runs against the
same database as the API row above it. Reads run on the dev cluster (unix
socket, fsync and synchronous_commit off); secrets.put and its pgbench script
on a durable cluster of the same PostgreSQL on the same disk (ext4), started
by the script with ${durable_settings}. Processes: ${pinning}.
Load average (uptime) at the start: ${load_top}; other work shared the machine.

| Workload | Throughput (/s) | p50 (ms) | p99 (ms) |
|---|---:|---:|---:|
| sites.get through the API | $(printf '%.0f' "$(json "$read_rpc" perSecond)") | $(json "$read_rpc" p50Ms) | $(json "$read_rpc" p99Ms) |
| pgbench select-only (-S) | $(printf '%.0f' "$sel_tps") | $sel_p50 | $sel_p99 |
| secrets.put through the API (durable cluster) | $(printf '%.0f' "$(json "$put_rpc" perSecond)") | $(json "$put_rpc" p50Ms) | $(json "$put_rpc" p99Ms) |
| pgbench: the statements one secrets.put commits (durable cluster) | $(printf '%.0f' "$put_tps") | $put_p50 | $put_p99 |

| Ratio | Value | Goal |
|---|---:|---:|
| sites.get / select-only | $read_ratio | at least 0.5 |
| secrets.put / its own SQL, durable cluster | $put_ratio | at least 0.8 |

Errors during the API runs: sites.get $(json "$read_rpc" errors), secrets.put $(json "$put_rpc" errors). Calls shed
(RATE_LIMITED by the default admission; the client then waits retryAfterMs):
sites.get $(json "$read_rpc" rateLimited), secrets.put $(json "$put_rpc" rateLimited).

## Round trips per call of the fleet's creates (this run)

Counted on the wire by computed (\`compute_rpc_db_round_trips\`, a pgx tracer: a
statement sent alone or a pipeline is one) in the end-to-end tests that hold
them (scripts/roundtrips.sh: \`TestCreateRoundTrips\` of instances, reservations
and sandboxes, \`TestWarmClaimWaitRoundTrips\`), through the HTTP API with real
computed and compute-agent processes on the dev PostgreSQL, fewest of three
calls where the test makes three; goal of issue 26: at most 8 each.

${roundtrips}
MD
	if [[ -f docs/benchmarks-notes.md ]]; then echo; cat docs/benchmarks-notes.md; fi
} >"$OUT"
fi

# --- (c) Load shedding and latency at half load (internal/admission) -------
# Open-loop runs (tools/loadbench -rate: calls start on schedule whatever
# the answers, latency counted from the scheduled start) against the peaks
# measured above: at half the peak, and at 150 % of the peak with shedding
# on (adaptive in-flight limit, queue bound and the wait check; SHED_CONFIG)
# and off (no in-flight limit, the queue bound at the store's own 2 s), each
# group on a fresh server; sites.get on the dev cluster, secrets.put on the
# durable one. Appends to $OUT. The wait check (queueTargetMs) is in
# "shedding on" since its law refuses only a share of the late calls
# (2026-11-29): in loaded A/B pairs it served as much or more than the
# adaptive limit alone at 150 % and refused less at half load
# (docs/benchmarks-notes.md, "Shedding only the excess"). Since the
# wt-shed3 change (2026-11-29) "adaptive" is the limit that follows the
# wait for a database connection, not latency: with the same option it
# served more than the latency-driven limit at 150 % in four loaded pairs
# of five and refused less at half load in all five
# (docs/benchmarks-notes.md, "(wt-shed3)").
shed_default='admission: {adaptive: true, maxQueueMs: 100, queueTargetMs: 5}'
printf '%s\n' "${SHED_CONFIG:-$shed_default}" >"$work/shed.yaml"
printf 'admission: {maxInFlight: 0}\n' >"$work/noshed.yaml"
rate_of() { python3 -c "print(f'{$1*$2:.0f}')"; }
load_shed=$(loadavg)
# The peaks these runs are judged against come from the same open-loop
# generator (loadbench -search, tools/loadbench/search.go: the arrival rate
# rises by 25 % per 3 s step while the server sustains it, goodput at least
# 0.97 of the rate and p99 within 100 ms, a failing step tried once more,
# then two bisections; after a failing step every connection is closed and
# the generator warmed up again, so that the next step does not run on the
# thousands of connections an overload opened), on a server without
# shedding, not from the closed loop of (a). READ_PEAK and PUT_PEAK skip the
# search.
cluster_pids() { # database URL: its postmaster and the postmaster's children
	local pm
	pm=$(as_pg head -n1 "$(psql_url "$1" -c 'show data_directory')/postmaster.pid")
	echo "$pm" $(pgrep -P "$pm")
}
# Section (c) runs PostgreSQL (both clusters, every process) on the
# generator's core rather than the server's (SHED_PG_CPUS chooses): on a
# core of its own the server's half-load latency is its own, not its wait
# behind PostgreSQL's backends on a shared core. On a quiet machine
# (2026-11-29, autogroup off) sites.get's half-load p99 was 4.2 and 4.5
# ms so, 6.0 to 7.7 ms with PostgreSQL on the server's core. With
# autogroup on, PostgreSQL (its own session's group) gets only half of
# the generator's core while the generator is busy: the same run's
# half-load p99 rose to 7.0 ms (sites.get) and 23 ms (secrets.put)
# (docs/benchmarks-notes.md, that morning's lead sections). The peaks are
# searched with the same placement; (a), (b) and what follows keep
# PostgreSQL with the server.
pin_postgres() { # cpus
	local u p
	for u in "$db_url" "$durable_url"; do
		for p in $(cluster_pids "$u"); do taskset -a -cp "$1" "$p" >/dev/null 2>&1 || true; done
	done
}
shed_pg_cpus=${SHED_PG_CPUS:-}
if [[ $PIN == 1 ]]; then
	shed_pg_cpus=${shed_pg_cpus:-$gen_cpus}
	pin_postgres "$shed_pg_cpus"
	shed_pinning="pinned with taskset: the server alone on core(s) $server_cpus; loadbench, pgbench and PostgreSQL on core(s) $shed_pg_cpus"
else
	shed_pinning=$pinning
fi
none='{}'
read_search=$none put_search=$none half_read=$none over_read_on=$none over_read_off=$none
half_put=$none over_put_on=$none over_put_off=$none
if shed_runs sites.get; then
	if [[ -n "${READ_PEAK:-}" ]]; then
		read_search="{\"perSecond\": $READ_PEAK, \"peakMethod\": \"given (READ_PEAK)\"}"
	else
		start_server "$db_url" "$work/noshed.yaml"
		cur_token=$token
		read_search=$(keep read_search "$(on_gen "$work/loadbench" -url "$api" -token "$cur_token" -tenant bench -method sites.get -site "$site" -search -search-from 2000)")
		stop_server
	fi
fi
if shed_runs secrets.put; then
	if [[ -n "${PUT_PEAK:-}" ]]; then
		put_search="{\"perSecond\": $PUT_PEAK, \"peakMethod\": \"given (PUT_PEAK)\"}"
	else
		start_server "$durable_url" "$work/noshed.yaml"
		cur_token=$dtoken
		put_search=$(keep put_search "$(on_gen "$work/loadbench" -url "$api" -token "$cur_token" -tenant bench -method secrets.put -search -search-from 300)")
		stop_server
	fi
fi
read_peak=$(json "$read_search" perSecond)
put_peak=$(json "$put_search" perSecond)
# The searches left dead rows and dirty buffers behind (secrets.put's
# search rewrote its 64 rows thousands of times): vacuum and checkpoint
# both databases now, so that autovacuum and the checkpointer do not run
# on the server's core during the runs below (pgbench vacuums before each
# of its runs for the same reason).
for u in "$db_url" "$durable_url"; do psql_url "$u" -c "VACUUM (ANALYZE)" -c "CHECKPOINT"; done
# The searches ran the core flat out: the runs below start once it is
# idle again (the load average printed with them lags by a minute).
scripts/settle.sh
# Run-queue wait (/proc/<pid>/task/*/schedstat, second field: ns runnable
# but not running) of the server and of PostgreSQL during the half-load
# runs: time the core was given to something else, inside every latency.
schedwait() { # pids...: total ns waited by their threads
	local w=0 p t a b c
	for p in "$@"; do for t in /proc/"$p"/task/*; do
		read -r a b c <"$t/schedstat" 2>/dev/null || continue
		w=$((w + b))
	done; done
	echo "$w"
}
waited() { # database URL, command...: runs it, then prints "server_s_per_s postgres_s_per_s" to fd 3
	local url=$1 s0 p0 t0 s1 p1 t1
	shift
	s0=$(schedwait "$server_pid"); p0=$(schedwait $(cluster_pids "$url")); t0=$(date +%s%N)
	"$@"
	s1=$(schedwait "$server_pid"); p1=$(schedwait $(cluster_pids "$url")); t1=$(date +%s%N)
	python3 -c "print(f'{($s1-$s0)/($t1-$t0):.2f} {max(0,$p1-$p0)/($t1-$t0):.2f}')" >&3
}
echo "0 0" >"$work/wait_read"; echo "0 0" >"$work/wait_put"
# Each half-load call's due time and latency (loadbench -timeline, kept
# under RAW_DIR): whether the calls over the goal cluster in a few stalls
# (the core given to something else for milliseconds) or spread out (a
# queue in the server).
timeline() { mkdir -p "${RAW_DIR:-$work}" && echo "-timeline ${RAW_DIR:-$work}/$1.timeline"; }
slow_windows() { # timeline file, goal ms: how the calls over the goal fall in 100 ms windows
	python3 - "$1" "$2" <<'PY'
import sys
path, goal = sys.argv[1], float(sys.argv[2])
try:
    rows = [l.split() for l in open(path).read().splitlines()[1:]]
except OSError:
    print("no timeline"); sys.exit()
calls = [(float(d), float(t)) for d, t, s in rows if s == "200"]
slow = [(d, t) for d, t in calls if t > goal]
windows = {int(d * 10) for d, _ in slow}
total = max(1, int(max((d for d, _ in calls), default=0) * 10) + 1)
worst = max((t for _, t in slow), default=0)
print(f"{len(slow)} of {len(calls)} calls over {goal:g} ms, in {len(windows)} of {total} windows of 100 ms (slowest {worst:.1f} ms)")
PY
}
for f in on_read off_read on_put off_put; do echo "0 0" >"$work/wait_$f"; done
if shed_runs sites.get; then
	start_server "$db_url" "$work/shed.yaml"
	cur_token=$token
	half_read=$(keep half_read "$(waited "$db_url" run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 0.5)" $(timeline half_read) 3>"$work/wait_read")")
	over_read_on=$(keep over_read_on "$(waited "$db_url" run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 1.5)" 3>"$work/wait_on_read")")
	stop_server
	start_server "$db_url" "$work/noshed.yaml"
	over_read_off=$(keep over_read_off "$(waited "$db_url" run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 1.5)" 3>"$work/wait_off_read")")
	stop_server
fi
if shed_runs secrets.put; then
	start_server "$durable_url" "$work/shed.yaml"
	cur_token=$dtoken
	half_put=$(keep half_put "$(waited "$durable_url" run_open -method secrets.put -rate "$(rate_of "$put_peak" 0.5)" $(timeline half_put) 3>"$work/wait_put")")
	over_put_on=$(keep over_put_on "$(waited "$durable_url" run_open -method secrets.put -rate "$(rate_of "$put_peak" 1.5)" 3>"$work/wait_on_put")")
	stop_server
	start_server "$durable_url" "$work/noshed.yaml"
	over_put_off=$(keep over_put_off "$(waited "$durable_url" run_open -method secrets.put -rate "$(rate_of "$put_peak" 1.5)" 3>"$work/wait_off_put")")
	stop_server
fi
# The same half-load rates through pgbench -R (its latency also counts from
# the schedule): what PostgreSQL, the disk's flush and the shared core give
# any client, against which the API's half-load p99 is read. pgbench gets
# as many connections as the server's pool (4 per server core, 8 to 32):
# more would queue more transactions on the same 64 rows and WAL flush.
pool=$(($(taskset -c "${server_cpus:-0-$((ncpu - 1))}" nproc) * 4)); pool=$((pool < 8 ? 8 : pool > 32 ? 32 : pool))
half_sel_p50=- half_sel_p99=- half_sql_p50=- half_sql_p99=-
if shed_runs sites.get; then
	if [[ $ONLY == shed ]]; then "$bin/pgbench" -i -q -s 10 "$db_url" >/dev/null 2>&1; fi
	read -r _ half_sel_p50 half_sel_p99 < <(run_pgbench "$db_url" -S -R "$(rate_of "$read_peak" 0.5)" -c "$pool")
fi
if shed_runs secrets.put; then
	read -r _ half_sql_p50 half_sql_p99 < <(run_pgbench "$durable_url" -f scripts/bench/secrets_put.sql -R "$(rate_of "$put_peak" 0.5)" -c "$pool")
fi
load_shed_end=$(loadavg)
if [[ $PIN == 1 ]]; then pin_postgres "$server_cpus"; fi # back with the server for what follows
row() { # label result
	printf '| %s | %.0f | %.0f | %s | %s | %s | %s | %s |\n' "$1" "$(json "$2" rate)" "$(json "$2" perSecond)" \
		"$(json "$2" p50Ms)" "$(json "$2" p99Ms)" "$(json "$2" rateLimited)" "$(json "$2" errors)" "$(json "$2" lateP99Ms)"
}
goodput() { python3 -c "p=$2; print(f'{$(json "$1" perSecond)/p:.2f}' if p else 'n/a')"; }
p99x() { python3 -c "h=$(json "$2" p99Ms); print(f'{$(json "$1" p99Ms)/h:.1f}' if h else 'n/a')"; }
# Whether the 150 % run was an overload: shedding off served less than
# the search's sustained share of the rate. If it served it whole, the
# peak was underestimated (a machine busier during the search than
# after it) and the 150 % rows rank nothing: say so beside them.
overload() { # name, off result
	python3 -c "
r, g = $(json "$2" rate), $(json "$2" perSecond)
print('' if not r else (f'$1: shedding off served {g:.0f} of {r:.0f}/s, an overload.' if g < 0.97*r else
      f'$1: **not an overload**: shedding off served {g:.0f} of {r:.0f}/s, so the peak was underestimated and these rows rank nothing (READ_PEAK/PUT_PEAK set it).'))"
}
{
	cat <<MD

## Load shedding and latency at half load

Written by \`make bench\` on $(date -u +%Y-%m-%d): open-loop runs (tools/loadbench \`-rate\`:
calls start on a fixed schedule whatever the answers, latency from the scheduled
start, ${SECONDS_PER_RUN} s after a 2 s warm-up) against the peaks above (sites.get
$(printf '%.0f' "$read_peak")/s on the dev cluster, secrets.put $(printf '%.0f' "$put_peak")/s on the durable cluster,
each found by loadbench's open-loop search on a server without shedding: $(json "$read_search" peakMethod);
the generator's own CPU per call in that search: sites.get $(json "$read_search" cpuUsPerCall) µs, secrets.put $(json "$put_search" cpuUsPerCall) µs),
each group on a fresh server. Shedding on is \`$(sed 's/^admission: //' "$work/shed.yaml")\`
(by default an in-flight limit following the wait for a database connection, 5 ms target, between the
pool's size and 64 x the pool, a 100 ms bound on the pool wait, and the check of the wait before
admission with a 5 ms target); off is \`admission: {maxInFlight: 0}\` (no limit, the
store's own 2 s wait). Goals: at
150 % goodput at least 0.9 of the peak and p99 of admitted calls under 4 x its
half-load value; at half load p99 of a read at most 5 ms and of a mutation at
most 10 ms. Processes: ${shed_pinning}. Load average (uptime) before and after these
runs: ${load_shed} and ${load_shed_end}. "Late" is the p99 of how far behind its
schedule the generator started calls (its own CPU shortage, inside every latency).

| Run | Rate asked (/s) | Goodput (/s) | p50 (ms) | p99 (ms) | Shed (429) | Errors | Late p99 (ms) |
|---|---:|---:|---:|---:|---:|---:|---:|
$(row "sites.get at half the peak" "$half_read")
$(row "sites.get at 150 %, shedding on" "$over_read_on")
$(row "sites.get at 150 %, shedding off" "$over_read_off")
$(row "secrets.put at half the peak" "$half_put")
$(row "secrets.put at 150 %, shedding on" "$over_put_on")
$(row "secrets.put at 150 %, shedding off" "$over_put_off")
| pgbench select-only at sites.get's half-load rate (-R, $pool clients) | $(rate_of "$read_peak" 0.5) | | $half_sel_p50 | $half_sel_p99 | | | |
| pgbench: secrets.put's statements at its half-load rate (-R, $pool clients) | $(rate_of "$put_peak" 0.5) | | $half_sql_p50 | $half_sql_p99 | | | |

Run-queue wait during the half-load runs (seconds per second, summed over
threads: time runnable but not running, because the core ran something
else; /proc/PID/task/*/schedstat): sites.get server $(cut -d' ' -f1 "$work/wait_read"), PostgreSQL
$(cut -d' ' -f2 "$work/wait_read"); secrets.put server $(cut -d' ' -f1 "$work/wait_put"), PostgreSQL $(cut -d' ' -f2 "$work/wait_put"). On a core of its
own the server's would be near 0; well above 0.01 the half-load p99 measures
the machine as much as the server. The scheduler: ${autogroup}. Where the
half-load calls over their goal fell (loadbench -timeline): sites.get
$(slow_windows "${RAW_DIR:-$work}/half_read.timeline" 5); secrets.put $(slow_windows "${RAW_DIR:-$work}/half_put.timeline" 10).
A few windows holding them all is a stall of the core (calls answered
together after it); calls over the goal in most windows, a queue. The same during the 150 % runs (server, PostgreSQL;
shedding on, then off): sites.get $(cat "$work/wait_on_read"), $(cat "$work/wait_off_read");
secrets.put $(cat "$work/wait_on_put"), $(cat "$work/wait_off_put").

| At 150 % | Goodput / peak | p99 / half-load p99 |
|---|---:|---:|
| sites.get, shedding on | $(goodput "$over_read_on" "$read_peak") | $(p99x "$over_read_on" "$half_read") |
| sites.get, shedding off | $(goodput "$over_read_off" "$read_peak") | $(p99x "$over_read_off" "$half_read") |
| secrets.put, shedding on | $(goodput "$over_put_on" "$put_peak") | $(p99x "$over_put_on" "$half_put") |
| secrets.put, shedding off | $(goodput "$over_put_off" "$put_peak") | $(p99x "$over_put_off" "$half_put") |

$(overload sites.get "$over_read_off") $(overload secrets.put "$over_put_off")
MD
	if [[ -f docs/benchmarks-shedding-notes.md ]]; then echo; cat docs/benchmarks-shedding-notes.md; fi
} >>"$OUT"

# --- Optional: notifier cost (NOTIFIER_BENCH=1; internal/notify) ------------
# secrets.put through the API with the notifier off (no notifier option) and
# with kind postgres, alternating NOTIFIER_ROUNDS times (default 3) on a fresh
# server each run, compared run by run. pgbench adds what the coalesced
# sender avoids: the same statements with a NOTIFY inside every transaction.
# Appends its table to $OUT.
if [[ "${NOTIFIER_BENCH:-}" == 1 && $ONLY != shed ]]; then
	rounds=${NOTIFIER_ROUNDS:-3}
	load_start=$(cut -d' ' -f1-3 /proc/loadavg)
	cur_token=$token
	printf 'notifier: {kind: postgres}\n' >"$work/notifier.yaml"
	off=() on=() errs=0
	for _ in $(seq "$rounds"); do
		for mode in off on; do
			if [[ $mode == on ]]; then start_server "$db_url" "$work/notifier.yaml"; else start_server "$db_url"; fi
			res=$(run_rpc -method secrets.put)
			stop_server
			errs=$((errs + $(json "$res" errors)))
			if [[ $mode == on ]]; then on+=("$(json "$res" perSecond)"); else off+=("$(json "$res" perSecond)"); fi
		done
	done
	sed 's/^COMMIT;$/SELECT pg_notify('"'computeplane_wake'"', '"'outbox'"');\nCOMMIT;/' scripts/bench/secrets_put.sql >"$work/secrets_put_notify.sql"
	read -r plain_tps _ < <(run_pgbench "$db_url" -f scripts/bench/secrets_put.sql)
	read -r notify_tps _ < <(run_pgbench "$db_url" -f "$work/secrets_put_notify.sql")
	off_list=$(IFS=,; echo "${off[*]}")
	on_list=$(IFS=,; echo "${on[*]}")
	# The cost is the median over rounds of 1 - on/off, each on-run paired
	# with the off-run just before it, so that load drifting over the runs
	# weighs on both sides alike.
	stats=$(python3 -c "
import statistics as s
off=[$off_list]; on=[$on_list]
cost = s.median(1 - n/o for o, n in zip(off, on))
spread = 100 * (max(off) - min(off)) / s.median(off)
print(f'{s.median(off):.0f} {s.median(on):.0f} {100*cost:.1f} {spread:.0f} ' + ' / '.join(f'{x:.0f}' for x in off) + '|' + ' / '.join(f'{x:.0f}' for x in on))")
	read -r med_off med_on cost spread runs <<<"$stats"
	pg_cost=$(python3 -c "print(f'{100*(1-$notify_tps/$plain_tps):.1f}')")
	{
		cat <<MD

## Notifier cost

Written by \`NOTIFIER_BENCH=1 scripts/bench.sh\` on $(date -u +%Y-%m-%d): secrets.put through
the API (api role alone, ${CLIENTS} clients, ${SECONDS_PER_RUN} s per run), with no notifier and with
\`notifier: {kind: postgres}\` (wake-ups after commit, NOTIFYs coalesced by one
sender, at most one per topic per 10 ms, outside the mutation's transaction),
alternating ${rounds} times. The cost is the median over the rounds of 1 - on/off,
each run with the notifier paired with the run without it just before. Goal: the
notifier costs at most 5 %. Load average at the start: ${load_start}.

| secrets.put | Median (/s) | Runs (/s) |
|---|---:|---|
| notifier off | $med_off | ${runs%%|*} |
| notifier postgres | $med_on | ${runs#*|} |
| **cost of the notifier** (median of paired runs) | **$cost %** | |

Run-to-run spread without the notifier (max - min over the median): $spread %; a
cost well inside it is noise, not the notifier.

What coalescing avoids, measured with pgbench on the statements one secrets.put
commits: the same transaction with a NOTIFY in it (one NOTIFY per mutation, which
takes a database-wide lock at commit) runs at $(printf '%.0f' "$notify_tps")/s against $(printf '%.0f' "$plain_tps")/s
without, a cost of $pg_cost %.

Errors during the notifier runs: $errs.
MD
	} >>"$OUT"
fi

# --- Commit-to-webhook latency (internal/webhooks BenchmarkCommitToDelivery) --
# A site created through the API, its event fanned out and delivered to a
# local https receiver: the time from the API's answer to the receiver, with
# the notifier waking the engine after commit and with the engine polling
# once a second. Appends its table to $OUT.
if [[ "${WEBHOOK_BENCH:-1}" == 1 && $ONLY != shed ]]; then
go test -run '^$' -bench CommitToDelivery -benchtime "${WEBHOOK_EVENTS:-300}x" ./internal/webhooks >"$work/webhook.out" 2>&1
{
	cat <<MD

## Commit to webhook delivery

Written by \`make bench\` on $(date -u +%Y-%m-%d): ${WEBHOOK_EVENTS:-300} sites created one after another
through the API, each event delivered to a local https receiver (one webhook).
Goal: p99 commit-to-delivery under 50 ms at a fast local receiver.

| Engine woken by | Deliveries/s | p50 (ms) | p99 (ms) |
|---|---:|---:|---:|
MD
	awk '/^BenchmarkCommitToDelivery\// {
		split($1, n, "/"); sub(/-[0-9]+$/, "", n[2]);
		for (i = 1; i <= NF; i++) { if ($(i+1) == "deliveries/s") d = $i; if ($(i+1) == "p50-ms") p50 = $i; if ($(i+1) == "p99-ms") p99 = $i }
		printf "| %s | %.0f | %s | %s |\n", n[2], d, p50, p99 }' "$work/webhook.out"
} >>"$OUT"
fi

echo "wrote $OUT"
cat "$OUT"
