#!/usr/bin/env bash
# End-to-end with the reference client library (@atproto/api, from npm):
# createAccount, login, post, getRecord, putRecord (profile), listRecords,
# describeRepo, deletePost, applyWrites, refreshSession, createAppPassword,
# getSession, logout — against a local Bulwark and `bulwark dev-plc`.
#
# Needs node (18+) and npm. Usage: scripts/atproto-api.sh
# (PDS_PORT / PLC_PORT move the ports; KEEP=1 keeps the work dir).
set -euo pipefail

PDS_PORT=${PDS_PORT:-2693}
PLC_PORT=${PLC_PORT:-2692}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/bulwark-api.XXXXXX)
chmod 711 "$work"
pids=()

cleanup() {
	local status=$?
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	if [ "$status" != 0 ]; then
		echo "--- bulwark log (tail) ---" >&2
		tail -n 40 "$work/serve.log" >&2 || true
	fi
	if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "work dir kept: $work"; fi
	exit "$status"
}
trap cleanup EXIT

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
cp scripts/atproto-api/package.json scripts/atproto-api/e2e.mjs "$work/"
(cd "$work" && npm install --no-audit --no-fund --loglevel=error)

"$work/bulwark" dev-plc --listen "127.0.0.1:$PLC_PORT" --file "$work/plc.jsonl" >"$work/plc.log" 2>&1 &
pids+=($!)
mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
BULWARK_PLC_URL="http://127.0.0.1:$PLC_PORT" \
	"$work/bulwark" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
	curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" >/dev/null 2>&1 && break
	sleep 0.5
done
(cd "$work" && node e2e.mjs "http://localhost:$PDS_PORT")
