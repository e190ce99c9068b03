#!/usr/bin/env bash
# The load benchmark of docs/benchmarks.md: one server (api role) on the dev
# PostgreSQL, driven over HTTP by tools/loadbench at a fixed concurrency, and
# pgbench on the same database in the same run: (a) select-only and (b) the
# statements one secrets.put commits (scripts/bench/secrets_put.sql). It
# writes the figures and the ratios RPC/pgbench to docs/benchmarks.md.
#
#   scripts/bench.sh            # 32 clients, 10 s per run
#   CLIENTS=64 BENCH_SECONDS=20 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-32}
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
OUT=${OUT:-docs/benchmarks.md}
work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

base_url=$(scripts/devdb.sh start)
bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | sort -V | tail -n1)")
psql_base() { "$bin/psql" "$base_url" -v ON_ERROR_STOP=1 -qAt "$@"; }
psql_base -c "DROP DATABASE IF EXISTS computeplane_bench WITH (FORCE)" -c "CREATE DATABASE computeplane_bench"
db_url=${base_url/\/postgres\?/\/computeplane_bench?}
export SERVICE_DATABASE_URL=$db_url
export SERVICE_SECRET=${SERVICE_SECRET:-bench-secret-0123456789abcdefghijklmnopqrstuvwxyz}

go build -o "$work/computed" ./cmd/computed
go build -o "$work/loadbench" ./tools/loadbench
"$work/computed" migrate
token=$("$work/computed" iam create-key --tenant bench --identity bench --role owner | tail -n1)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
HOST=127.0.0.1 PORT=$port SERVICE_ROLES=api SERVICE_PPROF_ADDR=${PPROF_ADDR:-} "$work/computed" >"$work/server.out" 2>"$work/server.log" &
server_pid=$!
api="http://127.0.0.1:$port/api/compute"
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done

site=$(curl -fs -X POST "$api/sites/create" -H 'X-Service: 1' -H 'Content-Type: application/json' \
	-H "Authorization: Bearer $token" \
	-d '{"tenantId":"bench","kind":"custom","region":"eu-west","idempotencyKey":"bench-site"}' |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["siteId"])')

run_rpc() { "$work/loadbench" -url "$api" -token "$token" -tenant bench -c "$CLIENTS" -d "${SECONDS_PER_RUN}s" "$@"; }
run_pgbench() { # prints: tps p50_ms p99_ms
	"$bin/pgbench" -n -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" -r -l --log-prefix="$work/pgb" "$@" "$db_url" >"$work/pgbench.out" 2>&1
	tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.out" | tail -n1)
	cat "$work"/pgb.* | awk '{print $3}' | sort -n >"$work/lat"
	n=$(wc -l <"$work/lat")
	p50=$(awk -v n="$n" 'NR==int(n*0.50)+1{printf "%.3f", $1/1000}' "$work/lat")
	p99=$(awk -v n="$n" 'NR==int(n*0.99)+1{printf "%.3f", $1/1000}' "$work/lat")
	rm -f "$work"/pgb.*
	echo "$tps $p50 $p99"
}
json() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d['$2'])" "$1"; }

if [[ -n "${PROFILE_DIR:-}" ]]; then # profile each API run (go tool pprof)
	mkdir -p "$PROFILE_DIR"
	profile() { curl -fs "http://${PPROF_ADDR}/debug/pprof/profile?seconds=$((SECONDS_PER_RUN - 1))" -o "$PROFILE_DIR/$1.pprof" & }
else
	profile() { :; }
fi
profile sites.get
read_rpc=$(run_rpc -method sites.get -site "$site")
"$bin/pgbench" -i -q -s 10 "$db_url" >/dev/null 2>&1
read -r sel_tps sel_p50 sel_p99 < <(run_pgbench -S)
profile secrets.put
put_rpc=$(run_rpc -method secrets.put)
read -r put_tps put_p50 put_p99 < <(run_pgbench -f scripts/bench/secrets_put.sql)

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
machine: $(nproc) cores ($cpu), $mem, $pgver (the dev cluster: unix socket,
fsync and synchronous_commit off), $(go version | cut -d' ' -f3). The server runs
the api role alone; the load generator (tools/loadbench) calls it through the
generated client over HTTP on loopback; pgbench runs against the same database.

| Workload | Throughput (/s) | p50 (ms) | p99 (ms) |
|---|---:|---:|---:|
| sites.get through the API | $(printf '%.0f' "$(json "$read_rpc" perSecond)") | $(json "$read_rpc" p50Ms) | $(json "$read_rpc" p99Ms) |
| pgbench select-only (-S) | $(printf '%.0f' "$sel_tps") | $sel_p50 | $sel_p99 |
| secrets.put through the API | $(printf '%.0f' "$(json "$put_rpc" perSecond)") | $(json "$put_rpc" p50Ms) | $(json "$put_rpc" p99Ms) |
| pgbench: the statements one secrets.put commits | $(printf '%.0f' "$put_tps") | $put_p50 | $put_p99 |

| Ratio | Value | Goal |
|---|---:|---:|
| sites.get / select-only | $read_ratio | at least 0.5 |
| secrets.put / its own SQL | $put_ratio | at least 0.8 |

Errors during the API runs: sites.get $(json "$read_rpc" errors), secrets.put $(json "$put_rpc" errors).
MD
	if [[ -f docs/benchmarks-notes.md ]]; then echo; cat docs/benchmarks-notes.md; fi
} >"$OUT"
echo "wrote $OUT"
cat "$OUT"
