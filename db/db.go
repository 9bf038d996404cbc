// Package db owns Bulwark's connection to Postgres: the pgx pool, embedded
// migrations, the managed (embedded) Postgres cluster, and the one place that
// translates driver errors into domain errors.
//
// # Connecting
//
// Open builds the pool every component shares; Migrate brings the schema in
// migrations.FS up to date and may be called by several nodes at once (they
// queue on an advisory lock). URLs reach logs only through RedactURL.
//
// # Errors
//
// Storage code passes driver errors through Translate, and everything above
// it tests with errors.Is against ErrNotFound, ErrConflict and
// ErrSerialization. Nothing outside the storage layer needs to import pgx.
//
// # Managed Postgres
//
// Without a database URL the server runs its own cluster with
// StartManaged: the system's initdb and postgres binaries, a data directory
// under the server's data directory, a Unix socket only, trust
// authentication on that socket (its directory is private to the server's
// user) and, when running as root, an unprivileged account (Postgres refuses
// root). The layout of the cluster directory is:
//
//	data/          PGDATA
//	postgres.log   server output, appended across runs
//	bulwark.lock   flocked while a process manages the cluster
//	.s.PGSQL.5432  the socket (under /tmp instead if the path is too long)
//
// A server left running by a process that was killed is found through
// postmaster.pid and shut down cleanly before the new one starts. Tests use
// the same code through package dbtest.
package db
