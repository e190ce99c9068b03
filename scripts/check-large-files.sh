#!/usr/bin/env bash
# check-large-files.sh fails when a tracked file is larger than LIMIT bytes
# (default 5 MB): build outputs and data belong outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${LIMIT:-5000000}"
status=0
while IFS= read -r -d '' f; do
	[[ -f "$f" ]] || continue
	size="$(stat -c %s "$f")"
	if ((size > limit)); then
		echo "check-large-files: $f is $size bytes (limit $limit): do not commit build outputs or data" >&2
		status=1
	fi
done < <(git ls-files -z)
exit "$status"
