#!/usr/bin/env bash
# Waits, before a benchmark, until the machine is quiet: the CPUs idle at
# least SETTLE_IDLE per cent over a SETTLE_WINDOW-second window, for at
# most SETTLE_MAX seconds. The load average lags by minutes (a 1-minute
# average falls from 10 to 1 in over two); the idle share of /proc/stat
# says at once whether the previous benchmark's processes are gone. It
# prints what it found, so the figures say how quiet their start was.
#
#   scripts/settle.sh                     # 90 % idle over 5 s, at most 300 s
#   SETTLE_IDLE=95 SETTLE_MAX=60 scripts/settle.sh
#   SETTLE_MAX=0 scripts/settle.sh        # measure once, do not wait
set -euo pipefail
want=${SETTLE_IDLE:-90}
window=${SETTLE_WINDOW:-5}
max=${SETTLE_MAX:-300}

idle_ticks() { awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

start=$SECONDS
while :; do
	read -r i0 t0 < <(idle_ticks)
	sleep "$window"
	read -r i1 t1 < <(idle_ticks)
	idle=$(((i1 - i0) * 100 / (t1 - t0 > 0 ? t1 - t0 : 1)))
	waited=$((SECONDS - start))
	if ((idle >= want)); then
		echo "settle: ${idle} % idle over ${window} s after ${waited} s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
		exit 0
	fi
	if ((waited >= max)); then
		echo "settle: still busy after ${waited} s: ${idle} % idle over ${window} s (load $(cut -d' ' -f1-3 /proc/loadavg)); going on" >&2
		exit 0
	fi
done
