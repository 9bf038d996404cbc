package populate

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

// tables are the tables a batch fills, in the order they are copied
// (referenced tables first), with the columns each row gives.
var tables = []struct {
	name    string
	columns []string
}{
	{"accounts", []string{"did", "handle", "email", "password_hash", "signing_key", "status", "created_at", "updated_at", "email_confirmed_at"}},
	{"repo_roots", []string{"did", "commit_cid", "commit_data", "data_cid", "rev", "created_at", "updated_at"}},
	{"repo_nodes", []string{"did", "cid", "rev", "data"}},
	{"records", []string{"did", "collection", "rkey", "cid", "rev", "data"}},
	{"record_blobs", []string{"did", "record_path", "blob_cid", "rev"}},
	{"blobs", []string{"did", "cid", "mime", "size", "storage_key", "created_at"}},
	{"dev_plc_operations", []string{"did", "seq", "cid", "operation", "created_at"}},
	{"refresh_tokens", []string{"jti", "session_id", "did", "app_password_name", "expires_at", "created_at"}},
	{"app_passwords", []string{"did", "name", "password_hash", "privileged", "created_at"}},
	{"account_preferences", []string{"did", "type", "value"}},
	{"oauth_devices", []string{"id", "user_agent", "created_at", "last_seen_at", "expires_at"}},
	{"oauth_device_accounts", []string{"device_id", "did", "signed_in_at", "expires_at"}},
	{"oauth_grants", []string{"id", "did", "client_id", "scope", "dpop_jkt", "client_auth", "refresh_hash", "expires_at", "created_at", "refreshed_at"}},
	{"email_outbox", []string{"state", "kind", "did", "recipient", "purpose", "code", "expires_at", "data", "attempts", "next_attempt_at", "note", "created_at", "updated_at", "sent_at"}},
	{"email_tokens", []string{"did", "purpose", "code_hash", "requested_at", "expires_at"}},
}

// store copies bt's rows and its bookkeeping row in one transaction.
// synchronous_commit is off for it: a crash may lose the last batches
// stored, but then their bookkeeping rows with them, and the next run
// builds them again.
func store(ctx context.Context, pool *pgxpool.Pool, bt *batch) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qAsyncCommit); err != nil {
			return err
		}
		for _, t := range tables {
			rs := bt.rows[t.name]
			if len(rs) == 0 {
				continue
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.columns, pgx.CopyFromRows(rs)); err != nil {
				return fmt.Errorf("copying %d rows into %s: %w", len(rs), t.name, err)
			}
		}
		_, err := tx.Exec(ctx, qInsertBatch, bt.shapes[0].Index, len(bt.shapes), bt.count)
		return err
	})
	if err != nil {
		return fmt.Errorf("populate: storing accounts %d-%d: %w", bt.shapes[0].Index, bt.shapes[len(bt.shapes)-1].Index, db.Translate(err))
	}
	bt.rows = nil
	return nil
}
