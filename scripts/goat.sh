#!/usr/bin/env bash
# goat end-to-end: drive a real Bulwark with goat, offline.
#
# Starts `bulwark serve` on loopback (its managed Postgres, or
# BULWARK_DATABASE_URL when set) with a local host name and no PLC URL, so
# that its DIDs live in the development PLC inside the server, at the
# server's own URL. Then, with any goat:
#
#   goat account create --pds-host ...        com.atproto.server.createAccount
#   goat account login  --pds-host ...        createSession
#   goat record create / update / delete      refreshSession + createRecord / putRecord / deleteRecord
#   goat blob upload                          uploadBlob (then a profile record refers to it)
#   goat repo inspect / ls / mst / unpack     offline, on the CAR getRepo serves
#
# and reads through curl (getRecord, listRecords, describeRepo, the DID
# document). Commands that resolve a DID need goat's --plc-host (current
# goat, github.com/bluesky-social/goat); with such a goat the script also
# runs, with --plc-host pointing at the server:
#
#   goat record get / ls, goat repo export, goat blob export
#
# The goat the Go module proxy serves (indigo's cmd/goat, $GOAT_VERSION
# below) has no --plc-host: it resolves DIDs only at plc.directory, so those
# four are skipped with it.
#
# Then the account moves to a second server, whose DIDs live in the first
# one's development PLC (BULWARK_PLC_URL), with any goat (`account
# migrate` resolves no DID: it talks to the logged-in server and to
# --pds-host only):
#
#   goat account plc request-token            requestPlcOperationSignature (the mail is
#                                             held; the code is read with `bulwark admin
#                                             account tokens`, as an operator would)
#   goat account migrate --pds-host ...       describeServer, getServiceAuth, createAccount,
#                                             createSession, getRepo + importRepo,
#                                             getPreferences + putPreferences, listBlobs +
#                                             getBlob + uploadBlob, checkAccountStatus,
#                                             getRecommendedDidCredentials, signPlcOperation,
#                                             submitPlcOperation, activateAccount,
#                                             deactivateAccount
#   goat account login / status / missing-blobs, goat record create   on the new server
#
# and checks with curl that the DID document names the second server, the
# old account is deactivated, and the records and the blob are served by
# the new one.
#
# Usage: scripts/goat.sh   (GOAT=/path/to/goat to use another goat, e.g. a
# current one; PDS_PORT to move the ports (the second server listens on
# PDS_PORT+1); KEEP=1 to keep the work dir)
set -euo pipefail

GOAT_VERSION=v0.0.0-20251003000214-3259b215110e
PDS_PORT=${PDS_PORT:-2683}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
setup_work goat
on_exit() {
	if [ "$1" != 0 ]; then
		for log in "$work"/serve*.log; do show_log "$(basename "$log")" "$log"; done
	fi
}

step() { printf '\n== %s\n' "$*"; }
# Checks pipe output into grep without -q: grep -q stops reading at the
# first match, and with pipefail the writer's SIGPIPE then fails the check.
fail() { echo "FAIL: $*" >&2; exit 1; }

step "build"
cd "$root"
go build -o "$work/bulwark" ./cmd/bulwark
if [ -z "${GOAT:-}" ]; then
	if command -v goat >/dev/null 2>&1 && goat --version 2>/dev/null | grep "$GOAT_VERSION" >/dev/null; then
		GOAT=$(command -v goat)
	else
		GOBIN="$work/bin" go install "github.com/bluesky-social/indigo/cmd/goat@$GOAT_VERSION"
		GOAT="$work/bin/goat"
	fi
fi
"$GOAT" --version
plc_host=
if "$GOAT" --help 2>&1 | grep -- '--plc-host' >/dev/null; then
	plc_host=yes
fi

pds="http://localhost:$PDS_PORT"

step "start bulwark (development PLC in the server)"
mkdir -m 711 "$work/data"
# No BULWARK_HOSTNAME: it is derived from the port (localhost:$PDS_PORT),
# and handles end in .test (the development suffix every client accepts).
BULWARK_DATA_DIR="$work/data" \
BULWARK_LISTEN="127.0.0.1:$PDS_PORT" \
	start serve.log "$work/bulwark" serve
poll 240 curl -fsS "$pds/xrpc/_health" || fail "bulwark did not come up"
grep -q "URL:            $pds" "$work/serve.log" || fail "the start banner does not give $pds"
grep -q "development PLC at $pds" "$work/serve.log" || fail "the start banner does not name the development PLC"

# goat keeps its session under $XDG_STATE_HOME: use a private one.
export XDG_STATE_HOME="$work/state" XDG_CONFIG_HOME="$work/config"
mkdir -p "$XDG_STATE_HOME" "$XDG_CONFIG_HOME"
handle="goat$$.test"
password="goat-e2e-password"

step "goat account create"
"$GOAT" account create --pds-host "$pds" --handle "$handle" --password "$password" --email "$handle@example.com"
did=$(curl -fsS "$pds/xrpc/com.atproto.identity.resolveHandle?handle=$handle" | sed -n 's/.*"did":"\([^"]*\)".*/\1/p')
[ -n "$did" ] || fail "resolveHandle found no DID for $handle"
echo "did: $did"
curl -fsS "$pds/$did" | grep "\"serviceEndpoint\":\"$pds\"" >/dev/null || fail "DID document at $pds/$did does not point at $pds"

step "goat account login"
"$GOAT" account login -u "$handle" -p "$password" --pds-host "$pds"

step "goat record create"
cat >"$work/post.json" <<JSON
{"\$type": "app.bsky.feed.post", "text": "hello from goat", "createdAt": "2026-11-29T12:00:00.000Z"}
JSON
out=$("$GOAT" record create --rkey goat1 "$work/post.json")
echo "$out"
echo "$out" | grep "at://$did/app.bsky.feed.post/goat1" >/dev/null || fail "record create printed no URI"
curl -fsS "$pds/xrpc/com.atproto.repo.getRecord?repo=$did&collection=app.bsky.feed.post&rkey=goat1" | grep "hello from goat" >/dev/null \
	|| fail "created record not readable"

step "goat record update"
sed 's/hello from goat/edited by goat/' "$work/post.json" >"$work/post2.json"
"$GOAT" record update --rkey goat1 "$work/post2.json"
curl -fsS "$pds/xrpc/com.atproto.repo.getRecord?repo=$did&collection=app.bsky.feed.post&rkey=goat1" | grep "edited by goat" >/dev/null \
	|| fail "updated record not readable"
curl -fsS "$pds/xrpc/com.atproto.repo.listRecords?repo=$did&collection=app.bsky.feed.post" | grep "goat1" >/dev/null \
	|| fail "listRecords misses the record"
curl -fsS "$pds/xrpc/com.atproto.repo.describeRepo?repo=$did" | grep '"app.bsky.feed.post"' >/dev/null \
	|| fail "describeRepo misses the collection"

step "goat blob upload (a profile avatar refers to it)"
# A 1x1 PNG.
echo 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==' | base64 -d >"$work/pixel.png"
blob=$("$GOAT" blob upload "$work/pixel.png")
echo "$blob"
blob_cid=$(echo "$blob" | tr -d ' \n' | sed -n 's/.*"\$link":"\([^"]*\)".*/\1/p')
[ -n "$blob_cid" ] || fail "blob upload printed no CID"
printf '{"$type": "app.bsky.actor.profile", "displayName": "goat", "avatar": %s}\n' "$blob" >"$work/profile.json"
"$GOAT" record create --rkey self "$work/profile.json"
curl -fsS "$pds/xrpc/com.atproto.sync.listBlobs?did=$did" | grep "$blob_cid" >/dev/null || fail "listBlobs misses the avatar"

step "goat repo inspect / ls / mst / unpack (offline, on getRepo's CAR)"
curl -fsS -o "$work/repo.car" "$pds/xrpc/com.atproto.sync.getRepo?did=$did"
"$GOAT" repo inspect "$work/repo.car" | grep "$did" >/dev/null || fail "repo inspect does not show $did"
"$GOAT" repo ls "$work/repo.car" | grep "app.bsky.feed.post/goat1" >/dev/null || fail "repo ls misses the post"
"$GOAT" repo mst "$work/repo.car" >/dev/null
"$GOAT" repo unpack -o "$work/unpacked" "$work/repo.car"
grep -rq "edited by goat" "$work/unpacked" || fail "repo unpack misses the post"

if [ -n "$plc_host" ]; then
	step "goat record get / ls, repo export, blob export (--plc-host $pds)"
	"$GOAT" --plc-host "$pds" record get "at://$did/app.bsky.feed.post/goat1" | grep "edited by goat" >/dev/null \
		|| fail "record get"
	"$GOAT" --plc-host "$pds" record ls "$did" | grep "goat1" >/dev/null || fail "record ls"
	"$GOAT" --plc-host "$pds" repo export -o "$work/export.car" "$did"
	"$GOAT" repo ls "$work/export.car" | grep "app.bsky.feed.post/goat1" >/dev/null || fail "repo export"
	"$GOAT" --plc-host "$pds" blob export -o "$work/blobs" "$did"
	[ -s "$work/blobs/$blob_cid" ] || fail "blob export did not fetch $blob_cid"
else
	step "goat record get / ls, repo export, blob export: skipped (this goat has no --plc-host)"
fi

step "goat record delete"
"$GOAT" record delete --collection app.bsky.feed.post --rkey goat1
status=$(curl -s -o /dev/null -w '%{http_code}' "$pds/xrpc/com.atproto.repo.getRecord?repo=$did&collection=app.bsky.feed.post&rkey=goat1")
[ "$status" = 400 ] || fail "deleted record still readable (HTTP $status)"

step "start a second bulwark (its DIDs in the first one's development PLC)"
pds2="http://localhost:$((PDS_PORT + 1))"
mkdir -m 711 "$work/data2"
BULWARK_DATA_DIR="$work/data2" \
BULWARK_LISTEN="127.0.0.1:$((PDS_PORT + 1))" \
BULWARK_PLC_URL="$pds" \
	start serve2.log "$work/bulwark" serve
poll 240 curl -fsS "$pds2/xrpc/_health" || fail "the second bulwark did not come up"

step "goat account plc request-token (the code waits in the outbox: bulwark admin account tokens)"
"$GOAT" account plc request-token
code=$("$work/bulwark" admin --url "$pds" --data-dir "$work/data" account tokens "$did" | awk '$1 == "plc_operation" { code = $2 } END { print code }')
[ -n "$code" ] || fail "no PLC operation code held for $did"

step "goat account migrate --pds-host $pds2"
new_handle="moved$$.test"
new_password="goat-e2e-new-password"
"$GOAT" account migrate --pds-host "$pds2" --new-handle "$new_handle" --new-password "$new_password" \
	--new-email "$new_handle@example.com" --plc-token "$code"
curl -fsS "$pds/$did" | grep "\"serviceEndpoint\":\"$pds2\"" >/dev/null || fail "the DID document does not name $pds2"
curl -fsS "$pds2/xrpc/com.atproto.sync.getRepoStatus?did=$did" | grep '"active":true' >/dev/null || fail "not active on $pds2"
curl -fsS "$pds/xrpc/com.atproto.sync.getRepoStatus?did=$did" | grep '"status":"deactivated"' >/dev/null || fail "not deactivated on $pds"
curl -fsS "$pds2/xrpc/com.atproto.repo.getRecord?repo=$did&collection=app.bsky.actor.profile&rkey=self" | grep "$blob_cid" >/dev/null \
	|| fail "the profile did not move"
curl -fsS -o "$work/moved.png" "$pds2/xrpc/com.atproto.sync.getBlob?did=$did&cid=$blob_cid"
cmp "$work/pixel.png" "$work/moved.png" || fail "the blob did not move"
curl -fsS -o "$work/moved.car" "$pds2/xrpc/com.atproto.sync.getRepo?did=$did"
"$GOAT" repo ls "$work/moved.car" | grep "app.bsky.actor.profile/self" >/dev/null || fail "repo ls misses the profile on $pds2"

step "goat account login / status / missing-blobs, record create on $pds2"
"$GOAT" account login -u "$did" -p "$new_password" --pds-host "$pds2"
"$GOAT" account status | tr -d ' \n' | grep '"activated":true' >/dev/null || fail "account status on $pds2"
missing=$("$GOAT" account missing-blobs)
[ -z "$missing" ] || fail "missing blobs on $pds2: $missing"
out=$("$GOAT" record create --rkey moved1 "$work/post.json")
echo "$out" | grep "at://$did/app.bsky.feed.post/moved1" >/dev/null || fail "record create on $pds2"

step "goat e2e passed"
