#!/usr/bin/env bash
# End-to-end service proxying with the reference client library
# (@atproto/api, from npm): getTimeline, getProfile, getFeed,
# listNotifications, chat.bsky.convo.listConvos (atproto-proxy: <chat
# DID>#bsky_chat), getPreferences/putPreferences, through a local Bulwark
# to fake services (internal/cmd/fakeservices) whose DIDs live in the same
# `bulwark dev-plc` as the account's. The fakes verify every service-auth
# token with indigo's ServiceAuthValidator and record iss/aud/lxm, which
# the script checks.
#
# Needs node (18+) and npm. Usage: scripts/proxy-api.sh
# (PDS_PORT / PLC_PORT move the ports; KEEP=1 keeps the work dir).
set -euo pipefail

PDS_PORT=${PDS_PORT:-2695}
PLC_PORT=${PLC_PORT:-2694}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/bulwark-proxy-api.XXXXXX)
chmod 711 "$work"
pids=()

cleanup() {
	local status=$?
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [ "$status" != 0 ]; then
		echo "--- bulwark log (tail) ---" >&2
		tail -n 40 "$work/serve.log" >&2 || true
		echo "--- fake services log (tail) ---" >&2
		tail -n 20 "$work/fakes.log" >&2 || true
	fi
	if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "work dir kept: $work"; fi
	exit "$status"
}
trap cleanup EXIT

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
go build -o "$work/fakeservices" ./internal/cmd/fakeservices
cp scripts/proxy-api/package.json scripts/proxy-api/e2e.mjs "$work/"
(cd "$work" && npm install --no-audit --no-fund --loglevel=error)

"$work/bulwark" dev-plc --listen "127.0.0.1:$PLC_PORT" --file "$work/plc.jsonl" >"$work/plc.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
	curl -fsS "http://127.0.0.1:$PLC_PORT/_health" >/dev/null 2>&1 && break
	sleep 0.5
done
"$work/fakeservices" --plc-url "http://127.0.0.1:$PLC_PORT" --env-file "$work/fakes.env" >"$work/fakes.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
	[ -s "$work/fakes.env" ] && break
	sleep 0.5
done
set -a
# shellcheck disable=SC1091
. "$work/fakes.env"
set +a

mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
BULWARK_PLC_URL="http://127.0.0.1:$PLC_PORT" \
BULWARK_APPVIEW_URL="$APPVIEW_URL" \
BULWARK_APPVIEW_DID="$APPVIEW_DID" \
BULWARK_PROXY_ALLOW_PRIVATE="127.0.0.0/8" \
	"$work/bulwark" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
	curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" >/dev/null 2>&1 && break
	sleep 0.5
done
(cd "$work" && node e2e.mjs "http://localhost:$PDS_PORT")
