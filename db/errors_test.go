package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// Postgres's own refusals of client text and of a guarded write become
// their sentinels, and nothing else does.
func TestTranslateTextAndGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)

	_, err := pool.Exec(ctx, `INSERT INTO audit_log (actor, action, subject) VALUES ($1, 'a', 's')`, "nul\x00byte")
	require.ErrorIs(t, db.Translate(err), db.ErrInvalidText, "NUL in a text column")
	_, err = pool.Exec(ctx, `INSERT INTO audit_log (actor, action, subject) VALUES ($1, 'a', 's')`, "bad \xff utf-8")
	require.ErrorIs(t, db.Translate(err), db.ErrInvalidText, "invalid UTF-8 in a text column")
	_, err = pool.Exec(ctx, `INSERT INTO audit_log (actor, action, subject, after) VALUES ('a', 'a', 's', $1::jsonb)`, `{"k":"\u0000"}`)
	require.ErrorIs(t, db.Translate(err), db.ErrInvalidText, `\u0000 in a jsonb column`)
	require.NotErrorIs(t, db.Translate(err), db.ErrConflict)

	_, err = pool.Exec(ctx, `SELECT bulwark_refuse_session('did:example:a')`)
	err = db.Translate(err)
	require.ErrorIs(t, err, db.ErrSessionRefused)
	require.NotErrorIs(t, err, db.ErrInvalidText)
	require.Equal(t, err, db.Translate(err), "translating twice changes nothing")

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM audit_log`).Scan(&n))
	require.Zero(t, n)
}

func TestConstraintName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	insert := `INSERT INTO repo_roots (did, commit_cid, commit_data, data_cid, rev) VALUES ('did:example:a', '\x01', '\x02', '\x03', 'r')`
	_, err := pool.Exec(ctx, insert)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, insert)
	require.Equal(t, "repo_roots_pkey", db.ConstraintName(db.Translate(err)))
	require.Empty(t, db.ConstraintName(db.ErrNotFound))
}
