// Package migrations holds Bulwark's versioned SQL schema, embedded into the
// binary and applied by goose (see db.Migrate).
//
// Files are named NNNNN_description.sql and use goose annotations. A file,
// once landed on main, is never edited: add a new one.
package migrations

import "embed"

// FS is the set of migration files.
//
//go:embed *.sql
var FS embed.FS
