# Sourced by the end-to-end scripts (atproto-api.sh, proxy-api.sh,
# oauth-browser.sh, appview.sh, goat.sh): a private work dir, the processes
# a script starts there, and the cleanup that ends them.
#
#   . "$(dirname "$0")/lib.sh"
#   setup_work NAME          # $root, $work (/tmp/bulwark-NAME.XXXXXX), the EXIT trap
#   start serve.log "$work/bulwark" serve    # in the background, stopped on exit
#   poll 120 curl -fsS "$url/xrpc/_health" || true
#
# On exit every process started with `start` is stopped, newest first; then
# on_exit STATUS runs when the script defines it (else, on failure, the tail
# of serve.log is shown); then the work dir is removed unless KEEP is set.

# setup_work NAME makes the work dir and sets the trap. Under root the
# managed Postgres runs as the postgres user, which must reach the data
# directory in it: hence mode 711.
setup_work() {
	root=$(cd "$(dirname "$0")/.." && pwd)
	work=$(mktemp -d "/tmp/bulwark-$1.XXXXXX")
	chmod 711 "$work"
	pids=()
	trap cleanup EXIT
}

# start LOG CMD... runs CMD in the background with its output in $work/LOG.
# Variables set before it (VAR=value start ...) reach CMD.
start() {
	local log=$1
	shift
	"$@" >"$work/$log" 2>&1 &
	pids+=($!)
}

# poll N CMD... runs CMD up to N times, half a second apart, until it
# succeeds; it fails when CMD never did. The processes are external, so
# there is no event to wait on.
poll() {
	local n=$1
	shift
	for _ in $(seq 1 "$n"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	return 1
}

# stop PID ends a process this script started: SIGTERM, up to 10 s to exit
# (bulwark stops its own cluster), then SIGKILL.
stop() {
	kill "$1" 2>/dev/null || return 0
	for _ in $(seq 1 50); do
		kill -0 "$1" 2>/dev/null || break
		sleep 0.2
	done
	kill -KILL "$1" 2>/dev/null
	wait "$1" 2>/dev/null
}

# show_log TITLE FILE [LINES] prints the tail of a log to stderr.
show_log() {
	echo "--- $1 (tail) ---" >&2
	tail -n "${3:-40}" "$2" >&2 2>/dev/null
}

cleanup() {
	local status=$?
	set +e
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
	if declare -F on_exit >/dev/null; then
		on_exit "$status"
	elif [ "$status" != 0 ]; then
		show_log "bulwark log" "$work/serve.log"
	fi
	if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "work dir kept: $work"; fi
	exit "$status"
}
