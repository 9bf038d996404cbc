package account

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
)

// Invite limits for one admin request.
const (
	MaxInviteCodesPerRequest = 1000
	MaxInviteUses            = 1_000_000
)

// InviteAdmin is for_account of codes made by an administrator for nobody
// in particular.
const InviteAdmin = "admin"

// InviteCode is an invite code and its uses.
type InviteCode struct {
	Code       string
	Available  int
	Disabled   bool
	ForAccount string
	CreatedBy  string
	CreatedAt  time.Time
	Uses       []InviteUse
}

// InviteUse is one account created with a code.
type InviteUse struct {
	UsedBy syntax.DID
	UsedAt time.Time
}

// newInviteCode makes a code like the reference PDS's:
// <host-with-dashes>-xxxxx-xxxxx.
func (s *Service) newInviteCode() string {
	host := strings.TrimPrefix(strings.TrimPrefix(s.cfg.PublicURL, "https://"), "http://")
	host = strings.NewReplacer(".", "-", ":", "-").Replace(host)
	b := make([]byte, 10)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = appPasswordAlphabet[int(b[i])%len(appPasswordAlphabet)]
	}
	return fmt.Sprintf("%s-%s-%s", host, b[:5], b[5:])
}

// CreateInviteCodes makes count codes of useCount uses for each of
// forAccounts (InviteAdmin when empty). e, when not nil, is recorded in
// the audit log in the same transaction, its After set to the codes made
// and their uses.
func (s *Service) CreateInviteCodes(ctx context.Context, count, useCount int, forAccounts []string, createdBy string, e *audit.Entry) (map[string][]string, error) {
	if count < 1 || count > MaxInviteCodesPerRequest {
		return nil, ruleErr(ErrInvalidInviteCode, "codeCount must be between 1 and %d", MaxInviteCodesPerRequest)
	}
	if useCount < 1 || useCount > MaxInviteUses {
		return nil, ruleErr(ErrInvalidInviteCode, "useCount must be between 1 and %d", MaxInviteUses)
	}
	if len(forAccounts) == 0 {
		forAccounts = []string{InviteAdmin}
	}
	if len(forAccounts)*count > MaxInviteCodesPerRequest {
		return nil, ruleErr(ErrInvalidInviteCode, "at most %d codes per request", MaxInviteCodesPerRequest)
	}
	out := map[string][]string{}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, acct := range forAccounts {
			if acct != InviteAdmin {
				if _, err := syntax.ParseDID(acct); err != nil {
					return ruleErr(ErrInvalidInviteCode, "forAccounts: %q is not a DID", acct)
				}
			}
			for range count {
				code := s.newInviteCode()
				if _, err := tx.Exec(ctx, qInsertInviteCode, code, useCount, acct, createdBy); err != nil {
					return db.Translate(err)
				}
				out[acct] = append(out[acct], code)
			}
		}
		if e == nil {
			return nil
		}
		e.After = map[string]any{"codes": out, "useCount": useCount}
		return audit.Record(ctx, tx, e)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// useInvite spends one use of code for did, inside the account's creation
// transaction.
func useInvite(ctx context.Context, tx db.DBTX, code string, did syntax.DID) error {
	var forAccount string
	err := db.Translate(tx.QueryRow(ctx, qUseInviteCode, code).Scan(&forAccount))
	if errors.Is(err, db.ErrNotFound) {
		return ruleErr(ErrInvalidInviteCode, "invite code %q is not valid or has no uses left", code)
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, qInsertInviteUse, code, did.String())
	return db.Translate(err)
}

// AccountInviteCodes lists the codes made for did.
func (s *Service) AccountInviteCodes(ctx context.Context, did syntax.DID) ([]InviteCode, error) {
	rows, err := s.pool.Query(ctx, qListInviteCodesFor, did.String())
	if err != nil {
		return nil, db.Translate(err)
	}
	return scanInviteCodes(rows)
}
