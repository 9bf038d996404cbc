package account

import (
	"context"
	"errors"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
)

// Email as a second sign-in factor (the lexicons' emailAuthFactor): with
// it on, a login with the account password also needs a code mailed to the
// account's confirmed address. The code has a purpose of its own
// (email.PurposeSignIn), so it opens nothing else and no other code opens
// a session. A mail is sent only after the password checked out, at most
// once per SignInCodeResend while the code lives, and a code dies after
// MaxSignInCodeFailures wrong guesses. App passwords are not subject to the
// factor, as on Bluesky's own hosting: they are for apps that cannot ask
// for the code.

// Bounds of the sign-in code.
const (
	// SignInCodeResend is how long a live sign-in code is kept, rather
	// than replaced with a new one (and a new mail), when the password is
	// given again without it: logins retried in a loop do not flood the
	// mailbox.
	SignInCodeResend = time.Minute
	// MaxSignInCodeFailures is how many wrong codes void the live one;
	// the next login with the password mails a new one.
	MaxSignInCodeFailures = 5
)

var (
	qSetEmailAuthFactor = emailQueries.MustGet("SetEmailAuthFactor")
)

// ErrAuthFactorTokenRequired means the password was right but the account
// needs its mailed sign-in code too, and none was given: one has been sent
// (createSession's AuthFactorTokenRequired).
var ErrAuthFactorTokenRequired = errors.New("a sign-in code sent to the account's email address is required")

// ErrEmailNotConfirmed means the email factor cannot be turned on: the
// account's address is not confirmed, so a code might never arrive.
var ErrEmailNotConfirmed = errors.New("email address not confirmed")

// NeedsAuthFactor reports whether a login of a with app (nil for the
// account password) needs the mailed sign-in code.
func NeedsAuthFactor(a *Account, app *AppPasswordInfo) bool {
	return a != nil && a.EmailAuthFactor && app == nil
}

// CheckAuthFactor is the second step of a login whose password checked
// out (LoginAccount, LoginTakendown): nothing when NeedsAuthFactor is
// false. Otherwise, without a code, it mails one (unless the live code is
// younger than SignInCodeResend) and fails with ErrAuthFactorTokenRequired;
// with one, it uses it up, or fails with email.ErrTokenInvalid or
// email.ErrTokenExpired (the wrong guess counted).
func (s *Service) CheckAuthFactor(ctx context.Context, a *Account, app *AppPasswordInfo, code string) error {
	if !NeedsAuthFactor(a, app) {
		return nil
	}
	if code == "" {
		if err := s.sendSignInCode(ctx, a.DID); err != nil {
			return err
		}
		return ruleErr(ErrAuthFactorTokenRequired, "A sign in code has been sent to your email address")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return s.mail.Consume(ctx, tx, a.DID, email.PurposeSignIn, code)
	})
	if !errors.Is(err, email.ErrTokenInvalid) {
		return err
	}
	void, ferr := s.mail.Fail(ctx, s.pool, a.DID, email.PurposeSignIn, MaxSignInCodeFailures)
	if ferr != nil {
		return ferr
	}
	if void {
		return ruleErr(email.ErrTokenInvalid, "Token is invalid: the sign-in code is wrong; sign in again with your password for a new one")
	}
	return ruleErr(email.ErrTokenInvalid, "Token is invalid: the sign-in code is wrong")
}

// sendSignInCode mails did a new sign-in code, unless its live one was
// issued less than SignInCodeResend ago.
func (s *Service) sendSignInCode(ctx context.Context, did syntax.DID) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		recent, err := s.mail.IssuedWithin(ctx, tx, did, email.PurposeSignIn, SignInCodeResend)
		if err != nil || recent {
			return err
		}
		return s.sendCode(ctx, tx, did, st, email.PurposeSignIn)
	})
}

// setAuthFactor turns did's email factor on or off inside tx, which holds
// the account's email lock (st). On needs a confirmed address.
func setAuthFactor(ctx context.Context, tx db.DBTX, did syntax.DID, st emailState, on bool) error {
	if on && (st.email == "" || !st.confirmed) {
		return ruleErr(ErrEmailNotConfirmed, "confirm your email address (com.atproto.server.confirmEmail) before turning on sign-in codes")
	}
	_, err := tx.Exec(ctx, qSetEmailAuthFactor, did.String(), on)
	return db.Translate(err)
}
