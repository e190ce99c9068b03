#!/usr/bin/env bash
# Database round trips per call of the fleet's creates, counted on the wire
# (computed's pgx tracer, compute_rpc_db_round_trips) by the end-to-end
# tests that hold them (TestCreateRoundTrips of instances, reservations and
# sandboxes; TestWarmClaimWaitRoundTrips, which boots a VM): real computed
# and compute-agent processes on the dev PostgreSQL. Prints a markdown
# table, one row per call the tests count (fleettest.RecordRoundTrips);
# scripts/bench.sh puts it in docs/benchmarks.md with the run's other
# figures. Fails if a test fails (a count above its bound among them).
#
#   scripts/roundtrips.sh            # needs SERVICE_DATABASE_URL and SERVICE_SECRET
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
log=$(mktemp)
trap 'rm -f "$out" "$log"' EXIT
if ! ROUNDTRIPS_OUT=$out go test -count=1 -p 1 -timeout 20m -run '^(TestCreateRoundTrips|TestWarmClaimWaitRoundTrips)$' \
	./internal/instances ./internal/reservations ./internal/sandboxes >"$log" 2>&1; then
	cat "$log" >&2
	echo "roundtrips.sh: a round-trip test failed" >&2
	exit 1
fi
echo "| Call | Round trips |"
echo "|---|---:|"
awk -F'\t' '{printf "| %s | %d |\n", $1, $2}' "$out"
