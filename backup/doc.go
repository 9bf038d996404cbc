// Package backup writes and restores a whole Bulwark server: a pg_dump of
// its database (custom format, one consistent snapshot), the blob store's
// files (disk store), and the generated secrets, with a JSON manifest that
// names every part and its checksum.
//
// A backup is a directory, or the same files as one tar stream:
//
//	database.dump           pg_dump --format=custom of the database
//	secrets/<name>          the files of <data-dir>/secrets (mode 0600)
//	blobs/<xx>/<cid>        the disk store's objects, in its own layout
//	manifest.json           written last: a backup without one is incomplete
//
// A backup may be taken while the server runs. pg_dump reads one snapshot;
// the blobs are copied after it, so every blob a record in the dump refers
// to is already on disk. Blobs uploaded meanwhile come along too; the dump
// has no row for them, so a restored server never serves them: they only
// take space (the collector works from rows, so it leaves them). A blob deleted
// between the snapshot and the copy (its account deleted during the backup)
// is missing from it.
//
// Restoring verifies everything before it writes anything: the dump's
// sha256, every blob's content against its CID, every secret's sha256. The
// database is then restored in one transaction (pg_restore
// --single-transaction), so a failed restore leaves it as it was.
//
// The Postgres client programs (pg_dump, pg_restore) are looked for where
// the server programs are (PATH, pg_config --bindir, /usr/lib/postgresql/*/bin,
// /usr/pgsql-*/bin), picking the oldest release not older than the server,
// since pg_dump refuses to dump a newer server.
package backup
