package account

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// testUse is a fresh createAccount service-auth use of iss, live a minute.
func testUse(iss syntax.DID) *ServiceAuthUse {
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	return &ServiceAuthUse{Purpose: "com.atproto.server.createAccount", Issuer: iss, JTI: hex.EncodeToString(jti), Expires: time.Now().Add(time.Minute)}
}

// TestUseServiceAuthOnce: a token is accepted once per purpose and
// issuer, a refused request's transaction records nothing, expired
// records are pruned, and a jti that cannot be keyed on is refused.
func TestUseServiceAuthOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	now := time.Now()
	u := testUse("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	require.NoError(t, UseServiceAuth(ctx, s.pool, *u, now))
	require.ErrorIs(t, UseServiceAuth(ctx, s.pool, *u, now), ErrServiceAuthReplayed)

	other := *u
	other.Purpose = "com.atproto.repo.uploadBlob"
	require.NoError(t, UseServiceAuth(ctx, s.pool, other, now), "another purpose")
	other = *u
	other.Issuer = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
	require.NoError(t, UseServiceAuth(ctx, s.pool, other, now), "another issuer")

	// A use whose transaction rolls back is not remembered.
	fresh := testUse(u.Issuer)
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, UseServiceAuth(ctx, tx, *fresh, now))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, UseServiceAuth(ctx, s.pool, *fresh, now))

	// Records go once their token has expired.
	var n int
	count := func() int {
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM service_auth_used").Scan(&n))
		return n
	}
	require.Equal(t, 4, count())
	next := testUse(u.Issuer)
	next.Expires = u.Expires.Add(time.Hour)
	require.NoError(t, UseServiceAuth(ctx, s.pool, *next, u.Expires.Add(time.Minute)))
	require.Equal(t, 1, count(), "only the live one is left")

	for _, jti := range []string{"", strings.Repeat("a", MaxJTILen+1), "has space", "nul\x00", "é"} {
		bad := *testUse(u.Issuer)
		bad.JTI = jti
		require.Error(t, UseServiceAuth(ctx, s.pool, bad, now), "%q", jti)
		require.False(t, ValidJTI(jti))
	}
}

// TestCreateImportedReplayRefused: a createAccount for an existing DID
// replayed with the same token is refused, and the account the first one
// created stays as it was.
func TestCreateImportedReplayRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	did := syntax.DID("did:plc:cccccccccccccccccccccccc")
	use := testUse(did)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "victim.test", Email: "victim@example.com", Password: "victim password", DID: did.String(), ServiceAuth: use})
	require.NoError(t, err)
	_, _, err = s.CreateAccount(ctx, CreateInput{Handle: "mallory.test", Email: "mallory@example.com", Password: "mallory password", DID: did.String(), ServiceAuth: use})
	require.ErrorIs(t, err, ErrServiceAuthReplayed)
	got, err := s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, "victim.test", got.Handle.String())
	require.NoError(t, s.CheckPassword(ctx, a.DID, "victim password"))

	// A fresh token does not replace a move in progress either.
	_, _, err = s.CreateAccount(ctx, CreateInput{Handle: "mallory.test", Email: "mallory@example.com", Password: "mallory password", DID: did.String(), ServiceAuth: testUse(did)})
	require.ErrorIs(t, err, ErrAccountExists)
	require.NoError(t, s.CheckPassword(ctx, a.DID, "victim password"))
}
