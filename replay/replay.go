// Package replay remembers single-use tokens (service-auth JWTs, by
// issuer and jti) until they expire, so that each is accepted once: a
// token copied from a log, a proxy or a leaky client cannot be presented
// again.
//
// The record is in Postgres, so that every node of a cluster refuses a
// token any node has accepted. A row lives as long as its token could
// still pass the expiry check; each Spend deletes a few expired rows, so
// the table holds at most the tokens accepted within the longest lifetime
// a verifier allows (an hour for service auth), which the verifier's own
// bound on exp and the callers' rate limits keep small.
package replay

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qSpend   = queries.MustGet("Spend")
	qUnspend = queries.MustGet("Unspend")
)

// ErrReplayed means the token was used before.
var ErrReplayed = errors.New("token already used")

// MaxIDLen bounds a token id (jti) the store keeps; callers refuse longer
// ones before they get here.
const MaxIDLen = 128

// Store records spent tokens in Postgres.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store over pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Spend records the token id of issuer as used until expires, or fails
// with ErrReplayed if it was used already. Concurrent spends of one token
// let exactly one through.
func (s *Store) Spend(ctx context.Context, issuer, id string, expires time.Time) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("replay: token id of %d bytes (1 to %d)", len(id), MaxIDLen)
	}
	var one int
	err := db.Translate(s.pool.QueryRow(ctx, qSpend, issuer, id, expires).Scan(&one))
	if errors.Is(err, db.ErrNotFound) {
		return ErrReplayed
	}
	if err != nil {
		return fmt.Errorf("replay: recording a spent token: %w", err)
	}
	return nil
}

// Unspend forgets a spent token, for a use that failed before it took
// effect (the upload it carried broke off), so that the client may retry
// with the same token while it lasts.
func (s *Store) Unspend(ctx context.Context, issuer, id string) error {
	if _, err := s.pool.Exec(ctx, qUnspend, issuer, id); err != nil {
		return fmt.Errorf("replay: forgetting a spent token: %w", db.Translate(err))
	}
	return nil
}
