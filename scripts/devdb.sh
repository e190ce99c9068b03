#!/usr/bin/env bash
# devdb.sh runs the private PostgreSQL cluster used by `make run` and
# `make test` when SERVICE_DATABASE_URL is unset.
#
#   scripts/devdb.sh start   create the cluster if needed, start it, print its URL
#   scripts/devdb.sh stop    stop it (no error when it is not running)
#   scripts/devdb.sh url     print the URL of the cluster
#   scripts/devdb.sh status  print running, stopped or absent (exit 0 only when running)
#
# The cluster lives under $REPO/.service/pg (data), $REPO/.service/run (unix
# socket) and logs to $REPO/.service/pg.log. It listens on the unix socket
# only; the port number, picked once and kept in .service/pg.port, only names
# the socket. Durability is switched off: this cluster holds throwaway data.
#
# initdb and postgres refuse to run as root, so as root the cluster runs as
# the postgres user. When that user cannot reach the repository (a home
# directory with mode 0700, say) the data and socket dirs move under /tmp and
# .service/pg.base records where.
#
# Only `start` and `url` write to stdout, and only the URL.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
SERVICE_DIR="$REPO/.service"
PORT_FILE="$SERVICE_DIR/pg.port"
BASE_FILE="$SERVICE_DIR/pg.base"
LOG_LINK="$SERVICE_DIR/pg.log"
LOCK_FILE="$SERVICE_DIR/devdb.lock"
MIN_PG_MAJOR=15
SOCKET_SUFFIX="/run/.s.PGSQL.65535"

# The caller's PG* variables must not point our tools at another cluster.
unset PGDATA PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD PGSERVICE PGOPTIONS 2>/dev/null || true

log() { printf 'devdb: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

is_root() { [[ "$(id -u)" == 0 ]]; }

# as_pg runs a command as the cluster's owner: postgres when we are root,
# ourselves otherwise. It runs from / so that an unreadable working
# directory does not upset the PostgreSQL tools.
as_pg() {
	if is_root; then
		(cd / && runuser -u postgres -- "$@")
	else
		(cd / && "$@")
	fi
}

# find_bindir prints the bin directory of the newest PostgreSQL >= 15.
find_bindir() {
	local best="" best_major=0 dir major
	for dir in /usr/lib/postgresql/*/bin; do
		[[ -x "$dir/initdb" && -x "$dir/pg_ctl" && -x "$dir/postgres" ]] || continue
		major="$(basename "$(dirname "$dir")")"
		[[ "$major" =~ ^[0-9]+$ ]] || continue
		if ((major >= MIN_PG_MAJOR && major > best_major)); then
			best="$dir"
			best_major="$major"
		fi
	done
	[[ -n "$best" ]] && printf '%s\n' "$best"
}

install_postgres() {
	log "PostgreSQL >= $MIN_PG_MAJOR not found under /usr/lib/postgresql; installing postgresql and postgresql-contrib"
	local sudo=()
	if ! is_root; then
		command -v sudo >/dev/null || die "not root and sudo is missing: install postgresql and postgresql-contrib by hand"
		sudo=(sudo -n)
	fi
	command -v apt-get >/dev/null || die "apt-get is missing: install PostgreSQL $MIN_PG_MAJOR+ with contrib by hand"
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update -qq >&2
	"${sudo[@]}" apt-get install -y -qq --no-install-recommends postgresql postgresql-contrib >&2
}

bindir() {
	local dir
	if ! dir="$(find_bindir)"; then
		install_postgres
		dir="$(find_bindir)" || die "PostgreSQL >= $MIN_PG_MAJOR still not found after installing"
	fi
	printf '%s\n' "$dir"
}

# base_dir prints the directory holding pg/ and run/.
base_dir() {
	if [[ -s "$BASE_FILE" ]]; then
		cat "$BASE_FILE"
	else
		printf '%s\n' "$SERVICE_DIR"
	fi
}

# choose_base decides, on first start, whether the cluster can live in the
# repository. Two things can force it to /tmp: the postgres user cannot
# traverse the path (when root), or the socket path would exceed the 107
# bytes a unix socket name may have.
choose_base() {
	local base="$SERVICE_DIR" reason=""
	if is_root && ! runuser -u postgres -- test -x "$SERVICE_DIR"; then
		reason="the postgres user cannot traverse $SERVICE_DIR"
	elif ((${#SERVICE_DIR} + ${#SOCKET_SUFFIX} > 100)); then
		reason="the socket path under $SERVICE_DIR is too long"
	fi
	if [[ -n "$reason" ]]; then
		local sum
		sum="$(printf '%s' "$REPO" | sha256sum | cut -c1-12)"
		base="/tmp/computeplane-devdb-$sum"
		log "$reason; using $base for the cluster instead"
		mkdir -p "$base"
		chmod 0755 "$base"
		printf '%s\n' "$base" >"$BASE_FILE"
	fi
}

port_in_use() {
	local port="$1"
	if command -v ss >/dev/null; then
		ss -Htan "( sport = :$port )" 2>/dev/null | grep -q . && return 0
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
	return 1
}

# choose_port picks a free port once; the socket is named after it.
choose_port() {
	[[ -s "$PORT_FILE" ]] && return 0
	local port i
	for ((i = 0; i < 200; i++)); do
		port=$((20000 + RANDOM % 40000))
		port_in_use "$port" && continue
		ls /tmp/.s.PGSQL."$port" >/dev/null 2>&1 && continue
		printf '%s\n' "$port" >"$PORT_FILE"
		return 0
	done
	die "no free port found"
}

port() {
	[[ -s "$PORT_FILE" ]] || die "no cluster yet: run scripts/devdb.sh start"
	cat "$PORT_FILE"
}

url() {
	local base port
	base="$(base_dir)"
	port="$(port)"
	printf 'postgres://postgres@/postgres?host=%s&port=%s&sslmode=disable\n' "$base/run" "$port"
}

# init_cluster creates the data directory and writes our settings.
init_cluster() {
	local bin="$1" base="$2" port="$3"
	local data="$base/pg" run="$base/run" logfile="$base/pg.log"
	mkdir -p "$data" "$run"
	touch "$logfile"
	chmod 0700 "$data"
	chmod 0755 "$run"
	if is_root; then
		chown postgres: "$data" "$run" "$logfile"
	fi
	log "initializing a cluster in $data (PostgreSQL $(basename "$(dirname "$bin")"))"
	as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >>"$logfile" 2>&1 ||
		die "initdb failed; see $logfile"
	as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# computeplane dev/test cluster (scripts/devdb.sh)
listen_addresses = ''
port = $port
unix_socket_directories = '$run'
unix_socket_permissions = 0777
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
log_min_error_statement = error
log_checkpoints = off
EOF
	as_pg tee "$data/pg_hba.conf" >/dev/null <<EOF
# computeplane dev/test cluster: unix socket only, trust.
local all all trust
EOF
}

running() {
	local bin="$1" data="$2"
	[[ -f "$data/PG_VERSION" ]] || return 1
	as_pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1
}

# start_server starts the server with only stdin, stdout and stderr open:
# a long-lived server that inherited our lock or a caller's pipe would hold
# the lock forever or keep the caller waiting for end of file.
start_server() {
	local bin="$1" data="$2" logfile="$3"
	(
		local fd
		for fd in /proc/$BASHPID/fd/*; do
			fd="${fd##*/}"
			if ((fd > 2)); then
				eval "exec $fd>&-"
			fi
		done
		as_pg "$bin/pg_ctl" start -D "$data" -l "$logfile" -w -t 60 -s >&2
	)
}

cmd_start() {
	mkdir -p "$SERVICE_DIR"
	exec 9>"$LOCK_FILE"
	flock 9
	local bin base data port
	bin="$(bindir)"
	[[ -s "$BASE_FILE" ]] || [[ -f "$SERVICE_DIR/pg/PG_VERSION" ]] || choose_base
	base="$(base_dir)"
	data="$base/pg"
	choose_port
	port="$(port)"
	if [[ ! -f "$data/PG_VERSION" ]]; then
		init_cluster "$bin" "$base" "$port"
	fi
	local have want
	have="$(cat "$data/PG_VERSION")"
	want="$(basename "$(dirname "$bin")")"
	[[ "$have" == "$want" ]] || die "$data was created by PostgreSQL $have but the binaries are $want: run scripts/devdb.sh stop and remove .service/pg"
	if [[ "$base" != "$SERVICE_DIR" ]]; then
		ln -sfn "$base/pg.log" "$LOG_LINK"
	fi
	if ! running "$bin" "$data"; then
		mkdir -p "$base/run"
		if is_root; then
			chown postgres: "$base/run"
		fi
		start_server "$bin" "$data" "$base/pg.log" || die "the cluster did not start; see $LOG_LINK"
	fi
	url
}

cmd_stop() {
	local bin data
	[[ -d "$SERVICE_DIR" ]] || return 0
	data="$(base_dir)/pg"
	[[ -f "$data/PG_VERSION" ]] || return 0
	bin="$(find_bindir)" || return 0
	if running "$bin" "$data"; then
		as_pg "$bin/pg_ctl" stop -D "$data" -m fast -w -t 60 -s >&2
	fi
}

cmd_status() {
	local bin data
	data="$(base_dir)/pg"
	if [[ ! -f "$data/PG_VERSION" ]]; then
		echo absent
		return 3
	fi
	if bin="$(find_bindir)" && running "$bin" "$data"; then
		echo "running $(url)"
		return 0
	fi
	echo stopped
	return 3
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
url) url ;;
status) cmd_status ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
