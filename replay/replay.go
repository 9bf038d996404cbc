// Package replay remembers single-use tokens (service-auth JWTs, by the
// method they were accepted for, their issuer and their jti) until they
// expire, so that each is accepted once: a token copied from a log, a
// proxy or a leaky client cannot be presented again.
//
// The record is in Postgres (table service_auth_used), so that every node
// of a cluster refuses a token any node has accepted. A use is recorded
// either on its own (Store.Spend, given back with Unspend when the call it
// carried failed before it took effect) or inside the transaction of the
// request the token authorises (Record: a refused request then records
// nothing). A row lives as long as its token could still pass the expiry
// check; each new use deletes a few expired rows, so the table holds at
// most the tokens accepted within the longest lifetime a verifier allows
// (an hour for service auth), which the verifiers' bound on exp and the
// callers' rate limits keep small.
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
	qPrune   = queries.MustGet("Prune")
	qSpend   = queries.MustGet("Spend")
	qUnspend = queries.MustGet("Unspend")
)

// ErrReplayed means the token was used before, for the same purpose.
var ErrReplayed = errors.New("token already used")

// MaxIDLen bounds a token id (jti) the store keeps (the reference PDS's
// are 32 hex digits, indigo's 22 base64 characters).
const MaxIDLen = 128

// Use is one accepted token.
type Use struct {
	// Purpose is what the token was accepted for: the method (its lxm).
	Purpose string
	// Issuer is the token's iss (a DID).
	Issuer string
	// ID is the token's jti: 1 to MaxIDLen printable ASCII characters.
	ID string
	// Expires is when the token stops being accepted (its exp plus the
	// verifier's leeway); the record is kept until then.
	Expires time.Time
}

// ValidID reports whether id may be recorded: 1 to MaxIDLen printable
// ASCII characters (it is stored and keyed on).
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen {
		return false
	}
	for i := range len(id) {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func (u Use) check() error {
	if !ValidID(u.ID) {
		return fmt.Errorf("replay: token id must be 1 to %d printable ASCII characters", MaxIDLen)
	}
	if u.Purpose == "" || u.Issuer == "" || u.Expires.IsZero() {
		return fmt.Errorf("replay: incomplete use %+v", u)
	}
	return nil
}

// Record records u through q, which should be the transaction of the
// request the token authorises, or fails with ErrReplayed if the token was
// used before for the same purpose. now decides which old records are
// pruned.
func Record(ctx context.Context, q db.DBTX, u Use, now time.Time) error {
	if err := u.check(); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, qPrune, now); err != nil {
		return fmt.Errorf("replay: pruning used tokens: %w", db.Translate(err))
	}
	tag, err := q.Exec(ctx, qSpend, u.Purpose, u.Issuer, u.ID, u.Expires)
	if err != nil {
		return fmt.Errorf("replay: recording a used token: %w", db.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s's token %.16q for %s", ErrReplayed, u.Issuer, u.ID, u.Purpose)
	}
	return nil
}

// Store records uses on their own, outside any request transaction.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store over pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Spend records u, or fails with ErrReplayed if the token was used
// already. Concurrent spends of one token let exactly one through.
func (s *Store) Spend(ctx context.Context, u Use) error {
	return Record(ctx, s.pool, u, time.Now())
}

// Unspend forgets a use that failed before it took effect (the upload it
// carried broke off), so that the client may retry with the same token
// while it lasts.
func (s *Store) Unspend(ctx context.Context, u Use) error {
	if _, err := s.pool.Exec(ctx, qUnspend, u.Purpose, u.Issuer, u.ID); err != nil {
		return fmt.Errorf("replay: forgetting a used token: %w", db.Translate(err))
	}
	return nil
}
