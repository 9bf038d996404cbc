#!/usr/bin/env bash
# End-to-end service proxying with the reference client library
# (@atproto/api, from npm): getTimeline, getProfile, getFeed,
# listNotifications, chat.bsky.convo.listConvos (atproto-proxy: <chat
# DID>#bsky_chat), getPreferences/putPreferences, and read-after-write for
# a new account (getAuthorFeed and getPostThread of posts with image,
# video, link and quote embeds the app view has not seen), through a local Bulwark
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
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
setup_work proxy-api
on_exit() {
	if [ "$1" != 0 ]; then
		show_log "bulwark log" "$work/serve.log"
		show_log "fake services log" "$work/fakes.log" 20
	fi
}

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
go build -o "$work/fakeservices" ./internal/cmd/fakeservices
cp scripts/proxy-api/package.json scripts/proxy-api/e2e.mjs "$work/"
(cd "$work" && npm install --no-audit --no-fund --loglevel=error)

start plc.log "$work/bulwark" dev-plc --listen "127.0.0.1:$PLC_PORT" --file "$work/plc.jsonl"
poll 60 curl -fsS "http://127.0.0.1:$PLC_PORT/_health" || true
start fakes.log "$work/fakeservices" --plc-url "http://127.0.0.1:$PLC_PORT" --env-file "$work/fakes.env"
poll 60 test -s "$work/fakes.env" || true
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
	start serve.log "$work/bulwark" serve
poll 120 curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" || true
(cd "$work" && node e2e.mjs "http://localhost:$PDS_PORT")
