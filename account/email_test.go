package account

import (
	"context"
	"errors"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
)

// heldCode is did's code for purpose from the outbox (the default Mailer
// has no SMTP server, so every mail is held).
func heldCode(t *testing.T, s *Service, did syntax.DID, purpose email.Purpose) string {
	t.Helper()
	pending, err := s.PendingEmailTokens(context.Background(), did)
	require.NoError(t, err)
	for _, p := range pending {
		if p.Purpose == purpose {
			return p.Code
		}
	}
	t.Fatalf("no held %s code", purpose)
	return ""
}

// A password change, by an administrator or with a mailed code, ends every
// session and every app password in the same transaction.
func TestPasswordChangeRevokesCredentials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, sess, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "first password"})
	require.NoError(t, err)
	b, bSess, err := s.CreateAccount(ctx, CreateInput{Handle: "bob.test", Email: "bob@example.com", Password: "bob password"})
	require.NoError(t, err)

	for round, change := range []func() string{
		func() string {
			require.NoError(t, s.SetPassword(ctx, a.DID, "second password"))
			return "second password"
		},
		func() string {
			require.NoError(t, s.RequestPasswordReset(ctx, "ALICE@example.com"))
			code := heldCode(t, s, a.DID, email.PurposeResetPassword)
			_, err := s.ResetPassword(ctx, code, "x")
			require.ErrorIs(t, err, ErrInvalidPassword)
			did, err := s.ResetPassword(ctx, code, "third password")
			require.NoError(t, err, "a refused password left the code usable")
			require.Equal(t, a.DID, did)
			_, err = s.ResetPassword(ctx, code, "fourth password")
			require.ErrorIs(t, err, email.ErrTokenInvalid, "once")
			return "third password"
		},
	} {
		ap, err := s.CreateAppPassword(ctx, a.DID, "phone", true)
		require.NoError(t, err)
		_, app, err := s.Login(ctx, "alice.test", ap.Password)
		require.NoError(t, err)
		appSess, err := s.CreateSession(ctx, a.DID, app)
		require.NoError(t, err)
		require.NoError(t, s.RequestEmailCode(ctx, a.DID, email.PurposePLCOperation))

		pw := change()
		_, _, err = s.Login(ctx, "alice.test", ap.Password)
		require.ErrorIs(t, err, ErrAuthFailed, "round %d: the app password is gone", round)
		aps, err := s.ListAppPasswords(ctx, a.DID)
		require.NoError(t, err)
		require.Empty(t, aps)
		for _, old := range []*Session{sess, appSess} {
			_, _, err = s.Refresh(ctx, old.RefreshJwt)
			require.ErrorIs(t, err, ErrInvalidToken, "round %d", round)
			_, err = s.Authenticate(ctx, old.AccessJwt)
			require.ErrorIs(t, err, ErrInvalidToken, "round %d", round)
		}
		pending, err := s.PendingEmailTokens(ctx, a.DID)
		require.NoError(t, err)
		require.Empty(t, pending, "round %d: mailed codes are revoked too", round)
		acct, _, err := s.Login(ctx, "alice.test", pw)
		require.NoError(t, err)
		sess, err = s.CreateSession(ctx, acct.DID, nil)
		require.NoError(t, err)
	}
	// Nobody else lost anything.
	_, err = s.Authenticate(ctx, bSess.AccessJwt)
	require.NoError(t, err)
	_, _, err = s.Login(ctx, b.Handle.String(), "bob password")
	require.NoError(t, err)
}

func TestEmailAddressChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "first password"})
	require.NoError(t, err)
	_, _, err = s.CreateAccount(ctx, CreateInput{Handle: "bob.test", Email: "bob@example.com", Password: "bob password"})
	require.NoError(t, err)

	require.NoError(t, s.RequestEmailCode(ctx, a.DID, email.PurposeConfirmEmail))
	code := heldCode(t, s, a.DID, email.PurposeConfirmEmail)
	require.ErrorIs(t, s.ConfirmEmail(ctx, a.DID, "bob@example.com", code), ErrEmailMismatch)
	require.NoError(t, s.ConfirmEmail(ctx, a.DID, "Alice@Example.com", code))
	got, err := s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.NotNil(t, got.EmailConfirmedAt)

	// The same address again changes nothing; a confirmed address needs a
	// code to change.
	require.NoError(t, s.SetEmail(ctx, a.DID, "alice@example.com"))
	got, err = s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.NotNil(t, got.EmailConfirmedAt)
	required, err := s.RequestEmailUpdate(ctx, a.DID)
	require.NoError(t, err)
	require.True(t, required)
	require.ErrorIs(t, s.UpdateEmail(ctx, a.DID, "new@example.com", "", nil), ErrTokenRequired)
	update := heldCode(t, s, a.DID, email.PurposeUpdateEmail)
	require.ErrorIs(t, s.UpdateEmail(ctx, a.DID, "bob@example.com", update, nil), ErrEmailTaken)
	require.Equal(t, update, heldCode(t, s, a.DID, email.PurposeUpdateEmail), "a refused change leaves the code")

	// An administrator's change unconfirms and revokes the codes too.
	require.NoError(t, s.SetEmail(ctx, a.DID, "admin-set@example.com"))
	got, err = s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, "admin-set@example.com", got.Email)
	require.Nil(t, got.EmailConfirmedAt)
	require.ErrorIs(t, s.UpdateEmail(ctx, a.DID, "new@example.com", update, nil), email.ErrTokenInvalid)
	require.NoError(t, s.UpdateEmail(ctx, a.DID, "new@example.com", "", nil), "unconfirmed: no code needed")

	// Reset for an address nobody has: no error, nothing queued.
	require.NoError(t, s.RequestPasswordReset(ctx, "nobody@example.com"))
	require.ErrorIs(t, s.RequestPasswordReset(ctx, "nobody"), ErrInvalidEmail)
	require.ErrorIs(t, s.RequestEmailCode(ctx, "did:plc:unknownunknownunknown", email.PurposeConfirmEmail), ErrAccountNotFound)
}

// failingCleaner refuses every deletion.
type failingCleaner struct{}

func (failingCleaner) DeleteAccountTx(context.Context, db.DBTX, syntax.DID) error {
	return errors.New("refused")
}

// A deletion that fails leaves its code usable: the code is used up in the
// deletion's transaction.
func TestDeleteWithCode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "first password"})
	require.NoError(t, err)
	require.NoError(t, s.RequestEmailCode(ctx, a.DID, email.PurposeDeleteAccount))
	code := heldCode(t, s, a.DID, email.PurposeDeleteAccount)

	require.ErrorIs(t, s.DeleteWithCode(ctx, a.DID, "wrong password", code), ErrAuthFailed)
	require.ErrorIs(t, s.DeleteWithCode(ctx, a.DID, "first password", "AAAAA-AAAAA"), email.ErrTokenInvalid)
	s.cfg.Cleaners = []Cleaner{failingCleaner{}}
	require.Error(t, s.DeleteWithCode(ctx, a.DID, "first password", code))
	s.cfg.Cleaners = nil
	require.Equal(t, code, heldCode(t, s, a.DID, email.PurposeDeleteAccount))
	require.NoError(t, s.DeleteWithCode(ctx, a.DID, "first password", code))
	_, err = s.Get(ctx, a.DID)
	require.ErrorIs(t, err, ErrAccountNotFound)
}
