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
// process holds its tree in cache: the commit is then built from the
// cached state and stored by one call of the SQL function
// bulwark_try_commit, which checks under the row lock that the stored
// commit is still the cached one. When another process (another node of a
// cluster) has moved the repository on, the cached tree is caught up with
// the records (or MST nodes) written since rather than reloaded, and a
// process that has seen a repository moved asks before its next commits
// to it, so that each is worked out once (refresh.go). Concurrent commits to different
// repos share one transaction and round trip (group commit).
//
// The code follows a commit's path: write.go prepares the writes (records
// encoded, per-record limits), apply.go runs a commit (optimistic or in a
// transaction), plan.go works it out (ops applied to the tree, commit
// signed, diff CAR and event built, limits checked), store.go and group.go
// send it to Postgres, state.go and cache.go keep the trees, refresh.go
// catches a tree up with other processes' commits, head.go
// creates, deletes and describes repositories, read.go serves reads.
//
// The package knows nothing about HTTP; handlers map its sentinel errors to
// XRPC errors.
package repo
