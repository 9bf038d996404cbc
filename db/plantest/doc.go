// Package plantest holds the query-plan test: every named query of every
// package (each .sql file of the module with "-- name:" markers) is
// prepared against a database populated to a realistic size
// (internal/populate, plus fill.sql for the thin tables) and explained as
// Postgres plans it once the statement is cached on a connection (its
// generic plan); a sequential scan of a table that grows with accounts,
// records or events fails the test, unless the query is listed in
// allowedScans with the reason it may.
//
// A new table must be classified in tables (growing or not): the test
// fails until it is.
package plantest
