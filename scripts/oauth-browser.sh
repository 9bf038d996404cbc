#!/usr/bin/env bash
# OAuth end to end in a real browser: the reference client library
# (@atproto/oauth-client-node, from npm) signs in to a local Bulwark, with
# the sign-in and consent pages driven in headless Chromium (Debian's
# chromium package, through playwright-core), then posts, refreshes,
# revokes, and revokes again from the connected-apps page. The pages are
# checked for accessibility (axe-core, labels, one h1, focus order) and
# for requests to any other host. See scripts/oauth-client/e2e.mjs.
#
# Needs node (18+), npm and /usr/bin/chromium; installs chromium with
# apt-get when it is missing and apt-get can run (as root, or with sudo),
# else skips with a message. Usage: scripts/oauth-browser.sh
# (PDS_PORT moves the port; CHROMIUM names another browser binary;
# SCREENSHOTS=<dir> saves each checked page as a PNG there; KEEP=1 keeps
# the work dir).
set -euo pipefail

PDS_PORT=${PDS_PORT:-2697}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
root=$(cd "$(dirname "$0")/.." && pwd)

if [ ! -x "$CHROMIUM" ]; then
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
	if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
		echo "oauth-browser.sh: installing chromium"
		$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update >/dev/null
		$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null
	fi
fi
if [ ! -x "$CHROMIUM" ]; then
	echo "oauth-browser.sh: $CHROMIUM not found and apt-get cannot install it; skipping the browser test"
	exit 0
fi

work=$(mktemp -d /tmp/bulwark-oauth.XXXXXX)
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
cp scripts/oauth-client/package.json scripts/oauth-client/package-lock.json scripts/oauth-client/*.mjs "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error)

# A local host name: plain http, and the development PLC in the server,
# where the client resolves the account's DID.
mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
	"$work/bulwark" serve >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
	curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" >/dev/null 2>&1 && break
	sleep 0.5
done
(cd "$work" && CHROMIUM="$CHROMIUM" SCREENSHOTS="${SCREENSHOTS:-}" node e2e.mjs "http://localhost:$PDS_PORT")
