#!/usr/bin/env bash
# The load benchmark of docs/benchmarks.md: one server (api role) on the dev
# PostgreSQL, driven over HTTP by tools/loadbench at a fixed concurrency, and
# pgbench on the same database in the same run: (a) select-only and (b) the
# statements one secrets.put commits (scripts/bench/secrets_put.sql). It
# writes the figures and the ratios RPC/pgbench to docs/benchmarks.md.
#
#   scripts/bench.sh            # 32 clients, 10 s per run
#   CLIENTS=64 BENCH_SECONDS=20 scripts/bench.sh
#   NOTIFIER_BENCH=1 scripts/bench.sh   # and the notifier section at the end
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

# --- Load shedding and latency at half load (internal/admission) -----------
# Open-loop runs (tools/loadbench -rate: calls start on schedule whatever
# the answers, latency counted from the scheduled start) against the peak
# sites.get and secrets.put rates measured above: at half the peak, and at
# 150 % of the peak with shedding on (the default admission) and off
# (admission: {maxInFlight: 0}), each on a fresh server. Appends to $OUT.
start_server() { # $1: SERVICE_CONFIG (empty: none)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	SERVICE_CONFIG=$1 HOST=127.0.0.1 PORT=$port SERVICE_ROLES=api "$work/computed" >>"$work/server.out" 2>>"$work/server.log" &
	server_pid=$!
	api="http://127.0.0.1:$port/api/compute"
	for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
}
stop_server() { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
run_open() { "$work/loadbench" -url "$api" -token "$token" -tenant bench -d "${SECONDS_PER_RUN}s" "$@"; }
printf 'admission: {maxInFlight: 0}\n' >"$work/noshed.yaml"
read_peak=$(json "$read_rpc" perSecond)
put_peak=$(json "$put_rpc" perSecond)
rate_of() { python3 -c "print(f'{$1*$2:.0f}')"; }
stop_server
start_server ""
half_read=$(run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 0.5)")
half_put=$(run_open -method secrets.put -rate "$(rate_of "$put_peak" 0.5)")
over_on=$(run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 1.5)")
stop_server
start_server "$work/noshed.yaml"
over_off=$(run_open -method sites.get -site "$site" -rate "$(rate_of "$read_peak" 1.5)")
stop_server
row() { # label result
	printf '| %s | %.0f | %.0f | %s | %s | %s | %s |\n' "$1" "$(json "$2" rate)" "$(json "$2" perSecond)" \
		"$(json "$2" p50Ms)" "$(json "$2" p99Ms)" "$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('rateLimited',0))" "$2")" "$(json "$2" errors)"
}
goodput() { python3 -c "print(f'{$(json "$1" perSecond)/$read_peak:.2f}')"; }
p99x() { python3 -c "h=$(json "$half_read" p99Ms); print(f'{$(json "$1" p99Ms)/h:.1f}' if h else 'n/a')"; }
{
	cat <<MD

## Load shedding and latency at half load

Written by \`make bench\` on $(date -u +%Y-%m-%d): open-loop runs (tools/loadbench \`-rate\`:
calls start on a fixed schedule whatever the answers, latency from the scheduled
start, ${SECONDS_PER_RUN} s after a 2 s warm-up) against the peaks above (sites.get
$(printf '%.0f' "$read_peak")/s, secrets.put $(printf '%.0f' "$put_peak")/s), each group on a fresh server.
Shedding on is the default \`admission\` (in flight at most 4 x the pool: $(python3 -c "import os; print(4*min(max(4*os.cpu_count(),8),32))") here);
off is \`admission: {maxInFlight: 0}\`. Goals: at 150 % goodput at least 0.9 of the
peak and p99 of admitted calls under 4 x its half-load value; at half load p99
of a read at most 5 ms and of a mutation at most 10 ms. Server and load
generator share the machine's $(nproc) cores (not pinned: with two cores, pinning
each to one would halve the server instead of isolating it).

| Run | Rate asked (/s) | Goodput (/s) | p50 (ms) | p99 (ms) | Shed (429) | Errors |
|---|---:|---:|---:|---:|---:|---:|
$(row "sites.get at half the peak" "$half_read")
$(row "secrets.put at half the peak" "$half_put")
$(row "sites.get at 150 %, shedding on" "$over_on")
$(row "sites.get at 150 %, shedding off" "$over_off")

| At 150 % | Goodput / peak | p99 / half-load p99 |
|---|---:|---:|
| shedding on | $(goodput "$over_on") | $(p99x "$over_on") |
| shedding off | $(goodput "$over_off") | $(p99x "$over_off") |
MD
} >>"$OUT"

# --- Optional: notifier cost (NOTIFIER_BENCH=1; internal/notify) ------------
# secrets.put through the API with the notifier off (no notifier option) and
# with kind postgres, alternating NOTIFIER_ROUNDS times (default 3) on a fresh
# server each run, compared run by run. pgbench adds what the coalesced
# sender avoids: the same statements with a NOTIFY inside every transaction.
# Appends its table to $OUT.
if [[ "${NOTIFIER_BENCH:-}" == 1 ]]; then
	rounds=${NOTIFIER_ROUNDS:-3}
	load_start=$(cut -d' ' -f1-3 /proc/loadavg)
	kill "$server_pid" 2>/dev/null || true
	wait "$server_pid" 2>/dev/null || true
	printf 'notifier: {kind: postgres}\n' >"$work/notifier.yaml"
	off=() on=() errs=0
	for _ in $(seq "$rounds"); do
		for mode in off on; do
			if [[ $mode == on ]]; then start_server "$work/notifier.yaml"; else start_server ""; fi
			res=$(run_rpc -method secrets.put)
			kill "$server_pid"
			wait "$server_pid" 2>/dev/null || true
			errs=$((errs + $(json "$res" errors)))
			if [[ $mode == on ]]; then on+=("$(json "$res" perSecond)"); else off+=("$(json "$res" perSecond)"); fi
		done
	done
	sed 's/^COMMIT;$/SELECT pg_notify('"'computeplane_wake'"', '"'outbox'"');\nCOMMIT;/' scripts/bench/secrets_put.sql >"$work/secrets_put_notify.sql"
	read -r plain_tps _ < <(run_pgbench -f scripts/bench/secrets_put.sql)
	read -r notify_tps _ < <(run_pgbench -f "$work/secrets_put_notify.sql")
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

echo "wrote $OUT"
cat "$OUT"
