#!/usr/bin/env bash
# Runs the headline throughput benchmarks (docs/BENCHMARKS.md) in rounds, each
# benchmark in its own process, and prints one markdown row per round with
# the hypervisor's steal during each run (ticks of 10 ms, /proc/stat): on a
# shared VM a run with more steal is slower, so rates are read with it.
#
#   scripts/bench-rounds.sh [rounds]    (default 3; ~1.5 min a round)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/repo.test" ./repo
go test -c -o "$tmp/pds.test" ./pds

steal() { awk 'NR==1 {print $9}' /proc/stat; }
# run BINARY DIR BENCH BENCHTIME: prints the benchmark lines, then the steal.
run() {
	local s0 out
	s0=$(steal)
	out=$(cd "$2" && "$1" -test.run '^$' -test.bench "$3" -test.benchtime "$4" 2>/dev/null | grep -E '^(Benchmark|[[:space:]]*[0-9]+[[:space:]])' || true)
	echo "$out"
	echo "steal $(( $(steal) - s0 ))"
}
# metric NAME: the value before NAME on the benchmark lines read from stdin.
metric() { awk -v m="$1" '$1 == m {print $2} {for (i = 2; i <= NF; i++) if ($i == m) print $(i-1)}'; }

echo "| round | one writer commits/s (p99 ms) [steal] | 16 writers commits/s [steal] | HTTP 1 client records/s [steal] | HTTP 16 clients records/s [steal] |"
echo "|---|---|---|---|---|"
for r in $(seq 1 "$rounds"); do
	one=$(run "$tmp/repo.test" repo 'CommitOneWriter$' 4000x)
	w16=$(run "$tmp/repo.test" repo 'Commit16Writers16Repos$' 6000x)
	http=$(run "$tmp/pds.test" pds 'CreateRecordHTTP' 4000x)
	h1=$(echo "$http" | grep 'clients=1-' | metric records/s)
	h16=$(echo "$http" | grep 'clients=16-' | metric records/s)
	printf '| %d | %s (%s) [%s] | %s [%s] | %s [%s] | %s [%s] |\n' "$r" \
		"$(echo "$one" | metric commits/s)" "$(echo "$one" | metric p99-ms)" "$(echo "$one" | metric steal)" \
		"$(echo "$w16" | metric commits/s)" "$(echo "$w16" | metric steal)" \
		"$h1" "$(echo "$http" | metric steal)" "$h16" "$(echo "$http" | metric steal)"
done
