package account

import (
	"context"
	_ "embed"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
)

// The mail flows: codes that confirm or change an address, reset a
// password, delete an account or sign a PLC operation, and an
// administrator's messages. Each runs in one transaction that locks the
// account row first, so a code, the mail that carries it (package email's
// outbox) and the change it authorises commit together or not at all, and
// a mail server that is down delays mail without failing the request.

//go:embed email.sql
var emailSQL string

var (
	emailQueries           = db.MustParseQueries(emailSQL)
	qLockAccountEmail      = emailQueries.MustGet("LockAccountEmail")
	qReplaceEmail          = emailQueries.MustGet("ReplaceEmail")
	qConfirmEmail          = emailQueries.MustGet("ConfirmEmail")
	qDeleteAllAppPasswords = emailQueries.MustGet("DeleteAllAppPasswords")
)

// Sentinel errors of the mail flows (besides package email's
// ErrTokenInvalid, ErrTokenExpired and ErrInvalidMessage, which they pass
// through). The pds package maps each to an XRPC error name.
var (
	// ErrNoEmail means the account has no email address to send a code to.
	ErrNoEmail = errors.New("account does not have an email address")
	// ErrEmailMismatch means the address given is not the account's.
	ErrEmailMismatch = errors.New("email does not match the account's address")
	// ErrTokenRequired means the change needs a mailed code and none was
	// given (updateEmail on a confirmed address).
	ErrTokenRequired = errors.New("confirmation token required")
)

// Mail is the Mailer the account's codes and messages go through (for
// other flows that use a mailed code, such as signing a PLC operation).
func (s *Service) Mail() *email.Mailer { return s.mail }

// emailState is an account's address as the mail flows see it.
type emailState struct {
	handle    syntax.Handle
	email     string
	confirmed bool
}

// lockEmail locks did's account row until tx ends (as lockAccount does)
// and returns its handle and address.
func lockEmail(ctx context.Context, tx db.DBTX, did syntax.DID) (emailState, error) {
	var st emailState
	var handle string
	var confirmedAt *time.Time
	err := db.Translate(tx.QueryRow(ctx, qLockAccountEmail, did.String()).Scan(&handle, &st.email, &confirmedAt))
	if errors.Is(err, db.ErrNotFound) {
		return st, ErrAccountNotFound
	}
	if err != nil {
		return st, err
	}
	st.handle, st.confirmed = syntax.Handle(handle), confirmedAt != nil
	return st, nil
}

// sendCode issues a new code of did for purpose, replacing any earlier
// one, and queues the mail that carries it to the account's address.
func (s *Service) sendCode(ctx context.Context, tx db.DBTX, did syntax.DID, st emailState, purpose email.Purpose) error {
	if st.email == "" {
		return ErrNoEmail
	}
	return s.mail.SendToken(ctx, tx, did, st.email, purpose, email.TokenData{Handle: st.handle.String()})
}

// RequestEmailCode mails did a new code for purpose (replacing any
// earlier one): com.atproto.server.requestEmailConfirmation,
// requestAccountDelete and com.atproto.identity.requestPlcOperationSignature.
// The code is used with the method the purpose names. opts run in the
// same transaction (the console's audit entry).
func (s *Service) RequestEmailCode(ctx context.Context, did syntax.DID, purpose email.Purpose, opts ...WriteOption) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if err := s.sendCode(ctx, tx, did, st, purpose); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
}

// ConfirmEmail is com.atproto.server.confirmEmail: address must be the
// account's (ErrEmailMismatch) and code its live confirm_email code; the
// code is used up and the address marked confirmed.
func (s *Service) ConfirmEmail(ctx context.Context, did syntax.DID, address, code string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if st.email == "" || !strings.EqualFold(strings.TrimSpace(address), st.email) {
			return ErrEmailMismatch
		}
		if err := s.mail.Consume(ctx, tx, did, email.PurposeConfirmEmail, code); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, qConfirmEmail, did.String(), s.cfg.Now())
		return db.Translate(err)
	})
}

// RequestEmailUpdate is com.atproto.server.requestEmailUpdate: changing a
// confirmed address needs a code, mailed now to that address; an
// unconfirmed one can be changed without. It reports whether a code is
// required (and was sent).
func (s *Service) RequestEmailUpdate(ctx context.Context, did syntax.DID) (tokenRequired bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if st.email == "" {
			return ErrNoEmail
		}
		tokenRequired = st.confirmed
		if !tokenRequired {
			return nil
		}
		return s.sendCode(ctx, tx, did, st, email.PurposeUpdateEmail)
	})
	return tokenRequired, err
}

// UpdateEmail is com.atproto.server.updateEmail: the address becomes
// address. When the current one is confirmed, code must be the live
// update_email code (ErrTokenRequired without one); a code given anyway is
// checked too. A new address is unconfirmed, every code mailed to the old
// one stops working, and sign-in codes go off with it. authFactor, when
// not nil, turns sign-in codes on or off (on needs the address, unchanged,
// to be confirmed: ErrEmailNotConfirmed).
func (s *Service) UpdateEmail(ctx context.Context, did syntax.DID, address, code string, authFactor *bool) error {
	address, err := normalizeEmail(address)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if st.confirmed && code == "" {
			return ruleErr(ErrTokenRequired, "confirmation token required: request one with com.atproto.server.requestEmailUpdate")
		}
		if code != "" {
			if err := s.mail.Consume(ctx, tx, did, email.PurposeUpdateEmail, code); err != nil {
				return err
			}
		}
		if err := s.replaceEmail(ctx, tx, did, st, address); err != nil {
			return err
		}
		if authFactor == nil {
			return nil
		}
		if st.email != address {
			st.confirmed = false
		}
		return setAuthFactor(ctx, tx, did, st, *authFactor)
	})
}

// replaceEmail stores address (normalized) as did's, unconfirmed, and
// revokes every code mailed to the old address. The current address
// changes nothing: it stays confirmed if it was.
func (s *Service) replaceEmail(ctx context.Context, tx db.DBTX, did syntax.DID, cur emailState, address string) error {
	if cur.email == address {
		return nil
	}
	_, err := tx.Exec(ctx, qReplaceEmail, did.String(), address)
	if err = db.Translate(err); errors.Is(err, db.ErrConflict) {
		return ruleErr(ErrEmailTaken, "email %s is already used by another account", address)
	}
	if err != nil {
		return err
	}
	return s.mail.RevokeAll(ctx, tx, did)
}

// RequestPasswordReset is com.atproto.server.requestPasswordReset: the
// account with address, in any status, is mailed a reset_password code.
// No account with that address is not an error, so that the answer does
// not tell who has an account here; a malformed address is
// ErrInvalidEmail, which says nothing about accounts either. For the same
// reason a mail the address's limit refuses (email.ErrRecipientLimited)
// is dropped with a log line, not an error. The other code requests pass
// that refusal on to their signed-in caller.
func (s *Service) RequestPasswordReset(ctx context.Context, address string) error {
	address, err := normalizeEmail(address)
	if err != nil {
		return err
	}
	a, err := s.scanAccount(s.pool.QueryRow(ctx, qGetAccountByEmail, address))
	if errors.Is(err, ErrAccountNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	err = s.RequestEmailCode(ctx, a.DID, email.PurposeResetPassword)
	switch {
	case errors.Is(err, ErrAccountNotFound):
		return nil // deleted meanwhile
	case errors.Is(err, email.ErrRecipientLimited):
		// Dropped, not refused: a refusal would tell an anonymous caller
		// that the address has an account here. No code was issued.
		s.log.Info("password reset mail dropped: its address had as much mail as the limit allows", "did", a.DID, "error", err)
		return nil
	}
	return err
}

// DeleteWithCode is com.atproto.server.deleteAccount: password must be
// did's account password (ErrAuthFailed, whether or not the account
// exists) and code its live delete_account code, which is used up in the
// deletion's transaction (so a failed deletion leaves it usable).
func (s *Service) DeleteWithCode(ctx context.Context, did syntax.DID, password, code string) error {
	if err := s.CheckPassword(ctx, did, password); err != nil {
		return err
	}
	return s.Delete(ctx, did, s.useEmailCode(did, email.PurposeDeleteAccount, code))
}

// useEmailCode makes a change (Delete, SetPassword, SetEmail) use up code,
// did's live code for purpose, in its transaction before the change: a
// wrong or expired code refuses the change.
func (s *Service) useEmailCode(did syntax.DID, purpose email.Purpose, code string) WriteOption {
	return func(o *writeOptions) {
		o.first = append(o.first, func(ctx context.Context, tx db.DBTX) error {
			return s.mail.Consume(ctx, tx, did, purpose, code)
		})
	}
}

// SendAdminEmail is com.atproto.admin.sendEmail: an administrator's
// message to did's address (email.ErrInvalidMessage for a subject or
// content over the limits). opts run in the same transaction (the audit
// entry).
func (s *Service) SendAdminEmail(ctx context.Context, did syntax.DID, subject, content string, opts ...WriteOption) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if st.email == "" {
			return ErrNoEmail
		}
		if err := s.mail.SendAdmin(ctx, tx, did, st.email, subject, content); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
}

// PendingEmailTokens returns did's codes whose mail has not been sent
// (none is while no SMTP server is configured), for an operator to pass
// on by other means. opts run in the same transaction (the audit entry:
// reading them is as good as reading the account's mail).
func (s *Service) PendingEmailTokens(ctx context.Context, did syntax.DID, opts ...WriteOption) ([]email.Pending, error) {
	var out []email.Pending
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if out, err = s.mail.PendingTokens(ctx, tx, did); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
	return out, err
}

// hostOf is the host (and port) of the server's public URL, for the
// default Mailer's Message-IDs and greeting.
func hostOf(publicURL string) string {
	u, err := url.Parse(publicURL)
	if err != nil {
		return ""
	}
	return u.Host
}
