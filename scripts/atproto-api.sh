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
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
setup_work api

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
cp scripts/atproto-api/package.json scripts/atproto-api/e2e.mjs "$work/"
(cd "$work" && npm install --no-audit --no-fund --loglevel=error)

start plc.log "$work/bulwark" dev-plc --listen "127.0.0.1:$PLC_PORT" --file "$work/plc.jsonl"
mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
BULWARK_PLC_URL="http://127.0.0.1:$PLC_PORT" \
	start serve.log "$work/bulwark" serve
poll 120 curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" || true
(cd "$work" && node e2e.mjs "http://localhost:$PDS_PORT")
