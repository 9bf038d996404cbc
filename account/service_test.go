package account

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/repo"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func newService(t *testing.T) *Service {
	t.Helper()
	pool := dbtest.New(t)
	srv := httptest.NewServer(plctest.New())
	t.Cleanup(srv.Close)
	rot, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	keys, err := NewKeyStore(pool, rot.Bytes())
	require.NoError(t, err)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pc, err := plc.NewClient(srv.URL, rot, nil)
	require.NoError(t, err)
	s, err := New(Config{
		Pool: pool, Keys: keys, Repo: repo.New(pool, keys, nil, repo.Config{Logger: logger}), PLC: pc,
		HandleDomains: []string{".test"}, PublicURL: "http://localhost:2583", ServiceDID: "did:web:localhost%3A2583",
		JWTSecret: []byte(strings.Repeat("k", 32)), Password: PasswordParams{Memory: 64, Time: 1, Threads: 1}, Logger: logger,
	})
	require.NoError(t, err)
	return s
}

func TestAdminOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	codes, err := s.CreateInviteCodes(ctx, 3, 1, nil, InviteAdmin, nil)
	require.NoError(t, err)
	require.Len(t, codes[InviteAdmin], 3)

	a, sess, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "Alice@Example.com", Password: "first password", InviteCode: codes[InviteAdmin][0]})
	require.NoError(t, err)
	require.Equal(t, "alice@example.com", a.Email)
	b, _, err := s.CreateAccount(ctx, CreateInput{Handle: "bob.test", Email: "bob@example.com", Password: "bob password"})
	require.NoError(t, err)

	got, err := s.GetMany(ctx, []syntax.DID{b.DID, a.DID, "did:plc:unknownunknownunknown"})
	require.NoError(t, err)
	require.Len(t, got, 2)
	inv, err := s.InvitedBy(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, codes[InviteAdmin][0], inv)

	// A new password ends every session and replaces the old one.
	require.ErrorIs(t, s.SetPassword(ctx, a.DID, "short"), ErrInvalidPassword)
	require.NoError(t, s.SetPassword(ctx, a.DID, "second password"))
	_, err = s.Authenticate(ctx, sess.AccessJwt)
	require.ErrorIs(t, err, ErrInvalidToken)
	_, _, err = s.Login(ctx, "alice.test", "first password")
	require.ErrorIs(t, err, ErrAuthFailed)
	_, _, err = s.Login(ctx, "alice.test", "second password")
	require.NoError(t, err)

	require.ErrorIs(t, s.SetEmail(ctx, a.DID, "bob@example.com"), ErrEmailTaken)
	require.NoError(t, s.SetEmail(ctx, a.DID, "new@example.com"))
	_, _, err = s.Login(ctx, "new@example.com", "second password")
	require.NoError(t, err)
	require.ErrorIs(t, s.SetEmail(ctx, "did:plc:unknownunknownunknown", "x@example.com"), ErrAccountNotFound)

	require.NoError(t, s.SetInvitesDisabled(ctx, a.DID, true, nil))
	a2, err := s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.True(t, a2.InvitesDisabled)

	page, next, err := s.ListInviteCodes(ctx, "", 2)
	require.NoError(t, err)
	require.Len(t, page, 2)
	require.NotEmpty(t, next)
	rest, next2, err := s.ListInviteCodes(ctx, next, 2)
	require.NoError(t, err)
	require.Len(t, rest, 1)
	require.Empty(t, next2)
	seen := map[string]bool{}
	for _, c := range append(page, rest...) {
		seen[c.Code] = true
		if c.Code == codes[InviteAdmin][0] {
			require.Len(t, c.Uses, 1)
			require.Equal(t, a.DID, c.Uses[0].UsedBy)
		}
	}
	require.Len(t, seen, 3)

	require.NoError(t, s.DisableInviteCodes(ctx, []string{codes[InviteAdmin][1]}, nil, nil))
	_, _, err = s.CreateAccount(ctx, CreateInput{Handle: "carol.test", Email: "carol@example.com", Password: "carol password", InviteCode: codes[InviteAdmin][1]})
	require.ErrorIs(t, err, ErrInvalidInviteCode)

	// Takedown: no login; reversal restores it.
	require.NoError(t, s.SetStatus(ctx, b.DID, StatusTakendown))
	_, _, err = s.Login(ctx, "bob.test", "bob password")
	require.ErrorIs(t, err, ErrAccountTakendown)
	require.NoError(t, s.SetStatus(ctx, b.DID, StatusActive))
	_, _, err = s.Login(ctx, "bob.test", "bob password")
	require.NoError(t, err)
}
