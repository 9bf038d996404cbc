// Package repo is Bulwark's repository engine: signed atproto repositories
// stored in Postgres.
//
// A write (Engine.Apply) runs as one Postgres transaction: it locks the
// account's repo_roots row, reads the root inside the lock, applies the
// operations to the MST with indigo's atproto/repo/mst, checks every protocol
// size limit on the exact bytes that would be sent to relays, and then stores
// the new MST nodes, records, root and #commit event together. Nothing is
// written when any check fails.
//
// A commit costs two round trips (BEGIN with the row lock and root read;
// then every write and COMMIT in one pipelined batch), or one when this
// process is the repo's only writer and holds its tree in cache: the commit
// is then built from the cached state and the single batch checks, under
// the row lock, that the stored commit is still the cached one
// (bulwark_swap_root), falling back to the two-round-trip path if not.
//
// The package knows nothing about HTTP; handlers map its sentinel errors to
// XRPC errors.
package repo
