#!/usr/bin/env bash
# tool-cache.sh OUT KEY -- BUILD... builds one test server (make tools) into
# OUT by running BUILD (which writes OUT), unless TOOLS_CACHE holds it
# already.
#
# TOOLS_CACHE (unset: no cache) is a directory outside the checkout, e.g.
# ~/.cache/computeplane/tools as .ci/run sets it: the binary is kept there
# under <name>/<sha256 of KEY and the Go toolchain>/, so a CI machine that
# keeps its home builds each version once (spicedb alone takes about 6 CPU
# minutes from a cold build cache) instead of on every clean checkout. KEY
# names what the binary is built from: module@version, or a hash of its
# sources.
set -euo pipefail
out="$1" key="$2"
shift 2
[[ "${1:-}" == -- ]] && shift
name="$(basename "$out")"
mkdir -p "$(dirname "$out")"

if [[ -z "${TOOLS_CACHE:-}" ]]; then
	exec "$@"
fi

sum="$(printf '%s\n%s\n' "$key" "$(go env GOVERSION GOOS GOARCH)" | sha256sum | cut -c1-16)"
dir="$TOOLS_CACHE/$name/$sum"
if [[ -x "$dir/$name" ]]; then
	echo "tool-cache: $name from $dir"
	cp "$dir/$name" "$out.tmp"
	mv "$out.tmp" "$out"
	exit
fi
"$@"
mkdir -p "$dir"
# Copied then renamed: a run killed half-way never leaves a partial binary
# that looks complete.
cp "$out" "$dir/.$name.tmp"
printf '%s\n' "$key" >"$dir/key"
mv "$dir/.$name.tmp" "$dir/$name"
echo "tool-cache: $name kept in $dir"
