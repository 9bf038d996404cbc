#!/usr/bin/env bash
# The cluster test: "more nodes" on real components (cmd/bulwark-cluster).
#
# A Postgres primary with a synchronous standby (the server binaries:
# initdb, postgres, pg_basebackup), SeaweedFS's S3 gateway, three
# `bulwark serve` nodes behind HAProxy, and PgBouncer in transaction mode
# for a fourth, all on loopback ports from CLUSTER_BASE_PORT (default
# 31700) to +63. Under write load it kills the sequencer's leader (kill -9),
# freezes the next one for 20 s (SIGSTOP), stops the primary and promotes
# the standby, and after each checks that no acknowledged write is missing
# and that every node's firehose is identical, gapless, without duplicates,
# with every #commit verifying; it prints what it measured.
#
#   scripts/cluster.sh
#   scripts/cluster.sh --only throughput --rounds 3   # the write throughput runs alone
#
# Arguments are passed on to bulwark-cluster (`--help` lists them).
#
# haproxy and pgbouncer come from Debian's packages (installed when missing
# and run as root). SeaweedFS's `weed` is built from the Go module proxy
# (2-8 minutes on 2 cores) into $BULWARK_CI_CACHE (default
# ~/.cache/bulwark-ci) and reused from there. KEEP=1 keeps the work dir.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
setup_work cluster

WEED_MODULE=github.com/seaweedfs/seaweedfs
WEED_VERSION=v0.0.0-20261109003541-7506e5f91cd6
cache=${BULWARK_CI_CACHE:-$HOME/.cache/bulwark-ci}
weed=$cache/weed-$WEED_VERSION

need=""
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need="$need haproxy"
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need="$need pgbouncer"
if [ -n "$need" ]; then
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	echo "cluster.sh: installing$need"
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need
	# Debian starts them as services; the test runs its own.
	for svc in $need; do $SUDO systemctl stop "$svc" 2>/dev/null || $SUDO service "$svc" stop 2>/dev/null || true; done
fi

if [ ! -x "$weed" ]; then
	echo "cluster.sh: building SeaweedFS $WEED_VERSION (once; kept in $cache)"
	mkdir -p "$cache"
	dir=$(cd "$work" && go mod download -json "$WEED_MODULE@$WEED_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "cluster.sh: could not download $WEED_MODULE@$WEED_VERSION" >&2; exit 1; }
	# go install refuses the module's replace directives; a build inside
	# it honours them.
	(cd "$dir" && go build -o "$weed.tmp" ./weed)
	mv "$weed.tmp" "$weed"
fi

(cd "$root" && go build -o "$work/bulwark" ./cmd/bulwark && go build -o "$work/bulwark-cluster" ./cmd/bulwark-cluster)
on_exit() { :; }
"$work/bulwark-cluster" --bulwark "$work/bulwark" --weed "$weed" --work "$work/run" \
	--base-port "${CLUSTER_BASE_PORT:-31700}" ${KEEP:+--keep} "$@"
