package email

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

// Purpose is what a mailed code authorises. The values are the reference
// PDS's email_token purposes.
type Purpose string

// Purposes.
const (
	PurposeConfirmEmail  Purpose = "confirm_email"  // com.atproto.server.confirmEmail
	PurposeUpdateEmail   Purpose = "update_email"   // com.atproto.server.updateEmail
	PurposeResetPassword Purpose = "reset_password" // com.atproto.server.resetPassword
	PurposeDeleteAccount Purpose = "delete_account" // com.atproto.server.deleteAccount
	PurposePLCOperation  Purpose = "plc_operation"  // com.atproto.identity.signPlcOperation
	// PurposeSignIn is Bulwark's own: the second factor of a password
	// login (createSession's authFactorToken) when the account turned
	// emailAuthFactor on.
	PurposeSignIn Purpose = "sign_in"
)

// Purposes lists every Purpose.
var Purposes = []Purpose{PurposeConfirmEmail, PurposeUpdateEmail, PurposeResetPassword, PurposeDeleteAccount, PurposePLCOperation, PurposeSignIn}

// Valid reports whether p is one of the Purpose constants.
func (p Purpose) Valid() bool {
	for _, q := range Purposes {
		if p == q {
			return true
		}
	}
	return false
}

// DefaultTokenTTL is how long a code stays valid: the reference PDS uses
// 15 minutes for every purpose.
const DefaultTokenTTL = 15 * time.Minute

// Token codes look like the reference PDS's: two groups of five characters
// of the RFC 4648 base32 alphabet, "7KQ2M-XW3ZD". The alphabet has no 0, 1,
// 8 or 9, so nothing reads as both a letter and a digit; what a person
// types back is upper-cased and a 0, 1 or 8 read as O, I or B.
const (
	codeAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	codeLen      = 10
	// maxCodeInput bounds what Consume looks at.
	maxCodeInput = 64
	// tokenRetention is how long an expired code is kept, so that using it
	// says "expired" rather than "invalid".
	tokenRetention = 24 * time.Hour
)

// Tokens issues and checks the codes sent by mail. Every method takes the
// caller's db.DBTX, so a code is issued or used inside the transaction
// that acts on it. The zero value works.
type Tokens struct {
	// TTL is how long a code is valid (default DefaultTokenTTL).
	TTL time.Duration
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

func (t Tokens) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func (t Tokens) ttl() time.Duration {
	if t.TTL > 0 {
		return t.TTL
	}
	return DefaultTokenTTL
}

// Issue makes a new code for did and purpose, replacing any earlier one
// (mail still queued with the earlier code is cancelled), and returns it.
// Only its hash is stored.
func (t Tokens) Issue(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose) (string, error) {
	code, _, err := t.issue(ctx, q, did, purpose)
	return code, err
}

func (t Tokens) issue(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose) (string, time.Time, error) {
	if !purpose.Valid() {
		return "", time.Time{}, fmt.Errorf("%w: %q", ErrInvalidPurpose, purpose)
	}
	if did == "" {
		return "", time.Time{}, fmt.Errorf("email: issue %s: no DID", purpose)
	}
	code, err := newCode()
	if err != nil {
		return "", time.Time{}, err
	}
	now := t.now()
	expires := now.Add(t.ttl())
	// The upsert first: it waits for a concurrent request's lock on the
	// row, so that request's mail is committed, and cancelled, below.
	if _, err := q.Exec(ctx, qUpsertToken, did.String(), string(purpose), hashCode(purpose, normalize(code)), now, expires); err != nil {
		return "", time.Time{}, fmt.Errorf("email: issue %s: %w", purpose, db.Translate(err))
	}
	if _, err := q.Exec(ctx, qCancelTokenMail, did.String(), string(purpose), "replaced by a newer request", now); err != nil {
		return "", time.Time{}, fmt.Errorf("email: issue %s: %w", purpose, db.Translate(err))
	}
	return code, expires, nil
}

// Consume checks code against did's live code for purpose and, if it
// matches and has not expired, uses it up: it works once. A wrong code is
// ErrTokenInvalid and leaves the live code alone; an expired one is
// ErrTokenExpired. Run it in the transaction that does what the code
// authorises, so that a rollback leaves the code usable.
func (t Tokens) Consume(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose, code string) error {
	if !purpose.Valid() {
		return fmt.Errorf("%w: %q", ErrInvalidPurpose, purpose)
	}
	norm := normalize(code)
	if norm == "" {
		return ErrTokenInvalid
	}
	var stored []byte
	var expires time.Time
	err := q.QueryRow(ctx, qLockToken, did.String(), string(purpose)).Scan(&stored, &expires)
	if err != nil {
		if err = db.Translate(err); errors.Is(err, db.ErrNotFound) {
			return ErrTokenInvalid
		}
		return fmt.Errorf("email: consume %s: %w", purpose, err)
	}
	if subtle.ConstantTimeCompare(stored, hashCode(purpose, norm)) != 1 {
		return ErrTokenInvalid
	}
	return t.use(ctx, q, did, purpose, expires)
}

// ConsumeByCode is Consume for flows that name no account
// (com.atproto.server.resetPassword): the code alone finds it, and the
// account's DID is returned. The lookup is by the code's hash, so its
// timing says nothing about the code.
func (t Tokens) ConsumeByCode(ctx context.Context, q db.DBTX, purpose Purpose, code string) (syntax.DID, error) {
	if !purpose.Valid() {
		return "", fmt.Errorf("%w: %q", ErrInvalidPurpose, purpose)
	}
	norm := normalize(code)
	if norm == "" {
		return "", ErrTokenInvalid
	}
	rows, err := q.Query(ctx, qLockTokenByCode, string(purpose), hashCode(purpose, norm))
	if err != nil {
		return "", fmt.Errorf("email: consume %s: %w", purpose, db.Translate(err))
	}
	var dids []string
	var expires time.Time
	for rows.Next() {
		var d string
		if err := rows.Scan(&d, &expires); err != nil {
			rows.Close()
			return "", fmt.Errorf("email: consume %s: %w", purpose, db.Translate(err))
		}
		dids = append(dids, d)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("email: consume %s: %w", purpose, db.Translate(err))
	}
	if len(dids) != 1 {
		return "", ErrTokenInvalid
	}
	did := syntax.DID(dids[0])
	if err := t.use(ctx, q, did, purpose, expires); err != nil {
		return "", err
	}
	return did, nil
}

// use deletes a matching code, unless it has expired.
func (t Tokens) use(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose, expires time.Time) error {
	now := t.now()
	if !now.Before(expires) {
		return ErrTokenExpired
	}
	if _, err := q.Exec(ctx, qDeleteToken, did.String(), string(purpose)); err != nil {
		return fmt.Errorf("email: consume %s: %w", purpose, db.Translate(err))
	}
	if _, err := q.Exec(ctx, qCancelTokenMail, did.String(), string(purpose), "code used", now); err != nil {
		return fmt.Errorf("email: consume %s: %w", purpose, db.Translate(err))
	}
	return nil
}

// IssuedWithin reports whether did has a live code for purpose issued
// less than d ago (on the Tokens' clock).
func (t Tokens) IssuedWithin(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose, d time.Duration) (bool, error) {
	var issued, expires time.Time
	err := db.Translate(q.QueryRow(ctx, qTokenIssued, did.String(), string(purpose)).Scan(&issued, &expires))
	switch {
	case errors.Is(err, db.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("email: token of %s: %w", purpose, err)
	}
	now := t.now()
	return now.Before(expires) && now.Sub(issued) < d, nil
}

// Fail counts a wrong guess at did's live code for purpose; once max
// guesses have failed the code is deleted (and its unsent mail
// cancelled), so that guessing is bounded whatever else limits the
// requests. It reports whether the code is void. Run it outside the
// transaction the guess failed in, which rolls back.
func (t Tokens) Fail(ctx context.Context, q db.DBTX, did syntax.DID, purpose Purpose, max int) (bool, error) {
	var failures int
	err := db.Translate(q.QueryRow(ctx, qCountTokenFailure, did.String(), string(purpose)).Scan(&failures))
	switch {
	case errors.Is(err, db.ErrNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("email: token of %s: %w", purpose, err)
	case failures < max:
		return false, nil
	}
	if _, err := q.Exec(ctx, qDeleteToken, did.String(), string(purpose)); err != nil {
		return false, fmt.Errorf("email: token of %s: %w", purpose, db.Translate(err))
	}
	if _, err := q.Exec(ctx, qCancelTokenMail, did.String(), string(purpose), "too many wrong guesses", t.now()); err != nil {
		return false, fmt.Errorf("email: token of %s: %w", purpose, db.Translate(err))
	}
	return true, nil
}

// RevokeAll deletes every code of did and cancels their unsent mail, as
// the reference PDS does when an account's email address changes.
func (t Tokens) RevokeAll(ctx context.Context, q db.DBTX, did syntax.DID) error {
	if _, err := q.Exec(ctx, qDeleteAcctTokens, did.String()); err != nil {
		return fmt.Errorf("email: revoke tokens: %w", db.Translate(err))
	}
	if _, err := q.Exec(ctx, qCancelAcctTokenMail, did.String(), "codes revoked", t.now()); err != nil {
		return fmt.Errorf("email: revoke tokens: %w", db.Translate(err))
	}
	return nil
}

// Pending is a code that has not reached its owner by mail yet.
type Pending struct {
	Purpose   Purpose
	Code      string
	ExpiresAt time.Time
}

// PendingTokens returns did's live codes whose mail is held or not sent
// yet, oldest first, for an operator to pass on by other means (a server
// without SMTP, or a mail server that is down). A code is readable only
// while its mail waits: sending, using, replacing or expiry clears it.
func (t Tokens) PendingTokens(ctx context.Context, q db.DBTX, did syntax.DID) ([]Pending, error) {
	rows, err := q.Query(ctx, qPendingTokens, did.String(), t.now())
	if err != nil {
		return nil, fmt.Errorf("email: pending tokens: %w", db.Translate(err))
	}
	defer rows.Close()
	var out []Pending
	for rows.Next() {
		var p Pending
		var purpose string
		if err := rows.Scan(&purpose, &p.Code, &p.ExpiresAt); err != nil {
			return nil, fmt.Errorf("email: pending tokens: %w", db.Translate(err))
		}
		p.Purpose = Purpose(purpose)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("email: pending tokens: %w", db.Translate(err))
	}
	return out, nil
}

// PruneTokens deletes codes that expired more than a day ago.
func (t Tokens) PruneTokens(ctx context.Context, q db.DBTX) (int64, error) {
	tag, err := q.Exec(ctx, qDeleteExpiredTokens, t.now().Add(-tokenRetention))
	if err != nil {
		return 0, fmt.Errorf("email: prune tokens: %w", db.Translate(err))
	}
	return tag.RowsAffected(), nil
}

// newCode returns a fresh "XXXXX-XXXXX" code with 50 random bits.
func newCode() (string, error) {
	var b [codeLen]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("email: random code: %w", err)
	}
	out := make([]byte, 0, codeLen+1)
	for i, v := range b {
		if i == codeLen/2 {
			out = append(out, '-')
		}
		// 256 is a multiple of 32: every symbol is equally likely.
		out = append(out, codeAlphabet[v&31])
	}
	return string(out), nil
}

// normalize turns what a person typed into the code's ten symbols, or ""
// if it cannot be a code.
func normalize(code string) string {
	if len(code) > maxCodeInput {
		return ""
	}
	var b strings.Builder
	for _, r := range strings.ToUpper(code) {
		switch {
		case r == '-' || r == ' ' || r == '\t':
			continue
		case r == '0':
			r = 'O'
		case r == '1':
			r = 'I'
		case r == '8':
			r = 'B'
		}
		if !strings.ContainsRune(codeAlphabet, r) {
			return ""
		}
		b.WriteRune(r)
	}
	if b.Len() != codeLen {
		return ""
	}
	return b.String()
}

// hashCode is what is stored of a code. The codes are random (50 bits) and
// live 15 minutes, so a plain SHA-256 is enough; the purpose is mixed in so
// that one precomputed table does not serve every purpose.
func hashCode(purpose Purpose, norm string) []byte {
	h := sha256.Sum256([]byte("bulwark email token\x00" + string(purpose) + "\x00" + norm))
	return h[:]
}
