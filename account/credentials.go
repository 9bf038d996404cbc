package account

import (
	"context"
	"errors"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
)

// Password changes. Whoever sets a new password (an administrator, or the
// holder of the mailbox through resetPassword) ends, in the same
// transaction, everything the old password let anybody do: sessions
// (refresh tokens, and with them the access tokens of those sessions, and
// the OAuth grants of Config.SessionEnders), app passwords (which would
// otherwise keep logging in), and codes mailed but not used. The
// reference PDS ends the sessions only.

// newPasswordHash checks a new password against the rules and hashes it.
func (s *Service) newPasswordHash(ctx context.Context, password string) (string, error) {
	if err := checkNewPassword(password); err != nil {
		return "", err
	}
	return s.hash.hash(ctx, password)
}

// replacePassword stores hash as did's password and revokes every
// credential of did, inside tx.
func (s *Service) replacePassword(ctx context.Context, tx db.DBTX, did syntax.DID, hash string) error {
	tag, err := tx.Exec(ctx, qSetPassword, did.String(), hash)
	if err != nil {
		return db.Translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrAccountNotFound
	}
	if err := s.endAllSessions(ctx, tx, did); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, qDeleteAllAppPasswords, did.String()); err != nil {
		return db.Translate(err)
	}
	return s.mail.RevokeAll(ctx, tx, did)
}

// ResetPassword is com.atproto.server.resetPassword: code, a live
// reset_password code mailed by RequestPasswordReset, names the account,
// whose password becomes password. The code is used up, the password
// replaced and every credential revoked in one transaction, so a refused
// password leaves the code usable and a failure changes nothing. It
// returns the account's DID. Errors: ErrInvalidPassword,
// email.ErrTokenInvalid, email.ErrTokenExpired.
func (s *Service) ResetPassword(ctx context.Context, code, password string) (syntax.DID, error) {
	if err := checkNewPassword(password); err != nil {
		return "", err
	}
	// The code first: a wrong one costs no password hash.
	did, err := s.codeOwner(ctx, email.PurposeResetPassword, code)
	if err != nil {
		return "", err
	}
	h, err := s.hash.hash(ctx, password)
	if err != nil {
		return "", err
	}
	if err := s.setPasswordHash(ctx, did, h, s.useEmailCode(did, email.PurposeResetPassword, code)); err != nil {
		if errors.Is(err, ErrAccountNotFound) {
			// Deleted since codeOwner looked: its codes went with it.
			return "", email.ErrTokenInvalid
		}
		return "", err
	}
	s.log.Info("password reset with a mailed code; sessions, app passwords and mailed codes revoked", "did", did)
	return did, nil
}

// setPasswordHash replaces did's password with hash and revokes every
// credential, in one transaction that locks the account first.
func (s *Service) setPasswordHash(ctx context.Context, did syntax.DID, hash string, opts ...WriteOption) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, _, err := lockAccount(ctx, tx, did); err != nil {
			return err
		}
		if err := runFirst(ctx, tx, opts); err != nil {
			return err
		}
		if err := s.replacePassword(ctx, tx, did, hash); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
}

// codeOwner returns the account whose live code for purpose code is,
// checking it in a transaction that is rolled back at once. Changes lock
// the account row before its codes (so that two never wait for each
// other); a code alone names no account to lock, so it is looked up first
// and checked again, in that order, by the change itself.
func (s *Service) codeOwner(ctx context.Context, purpose email.Purpose, code string) (syntax.DID, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return "", db.Translate(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return s.mail.ConsumeByCode(ctx, tx, purpose, code)
}
