#!/usr/bin/env bash
# OAuth end to end in a real browser: the reference client library
# (@atproto/oauth-client-node, from npm) signs in to a local Bulwark, with
# the sign-in and consent pages driven in headless Chromium (Debian's
# chromium package, through playwright-core), then posts, refreshes,
# revokes, and revokes again from the connected-apps page; then an app asks
# for a permission set (include: scope) that another account of the
# server publishes, its _lexicon TXT record served by a DNS server on this
# machine (internal/cmd/devdns, which the server asks through
# --dns-server); last, an account with email sign-in codes on signs in
# with its password and the code (read with the admin method the operator
# of a server without SMTP uses). The pages are checked for accessibility
# (axe-core, labels, one h1, focus order) and for requests to any other
# host. See scripts/oauth-client/e2e.mjs.
#
# Needs node (18+), npm and /usr/bin/chromium; installs chromium with
# apt-get when it is missing and apt-get can run (as root, or with sudo),
# else skips with a message. Usage: scripts/oauth-browser.sh
# (PDS_PORT moves the port, and the DNS server's two with it, PDS_PORT+1
# and PDS_PORT+2; CHROMIUM names another browser binary;
# SCREENSHOTS=<dir> saves each checked page as a PNG there; KEEP=1 keeps
# the work dir).
set -euo pipefail

PDS_PORT=${PDS_PORT:-2697}
DNS_PORT=$((PDS_PORT + 1))
DNS_CONTROL_PORT=$((PDS_PORT + 2))
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}

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

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
setup_work oauth

cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
go build -o "$work/devdns" ./internal/cmd/devdns
cp scripts/oauth-client/package.json scripts/oauth-client/package-lock.json scripts/oauth-client/*.mjs "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error)

start devdns.log "$work/devdns" --listen "127.0.0.1:$DNS_PORT" --control "127.0.0.1:$DNS_CONTROL_PORT"
poll 20 curl -fsS -o /dev/null -d name=_probe.test -d value=x "http://127.0.0.1:$DNS_CONTROL_PORT/txt" || true

# A local host name: plain http, and the development PLC in the server,
# where the client resolves the account's DID. Its DNS lookups go to the
# DNS server above, and its outbound requests may reach this machine
# (the permission set's publisher is this server).
mkdir -m 711 "$work/data"
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
BULWARK_HOSTNAME="localhost:$PDS_PORT" \
BULWARK_HANDLE_DOMAINS=".test" \
BULWARK_DNS_SERVER="127.0.0.1:$DNS_PORT" \
BULWARK_PROXY_ALLOW_PRIVATE="127.0.0.0/8" \
	start serve.log "$work/bulwark" serve
poll 120 curl -fsS "http://localhost:$PDS_PORT/xrpc/_health" || true
(cd "$work" && CHROMIUM="$CHROMIUM" SCREENSHOTS="${SCREENSHOTS:-}" DNS_CONTROL="http://127.0.0.1:$DNS_CONTROL_PORT" \
	ADMIN_PASSWORD="$(cat "$work/data/secrets/admin-password")" node e2e.mjs "http://localhost:$PDS_PORT")
