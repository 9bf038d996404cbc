package account

import (
	"errors"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// A remembered token is still refused once it expires, for another type,
// or for a scope it does not carry: the cache saves only the verification.
func TestVerifiedTokensStillChecked(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &signer{secret: []byte("0123456789abcdef0123456789abcdef"), audience: "did:web:pds.test",
		accessTTL: time.Hour, refreshTTL: 24 * time.Hour, now: func() time.Time { return now }}
	did := syntax.DID("did:plc:abcdefghijklmnopqrstuvwx")
	sess, _, err := s.issue(did, ScopeAppPass, "sid", "jti")
	require.NoError(t, err)

	for range 2 { // verified, then remembered
		c, err := s.parse(sess.AccessJwt, typAccess, ScopeAccess, ScopeAppPass)
		require.NoError(t, err)
		require.Equal(t, did, c.DID)
		require.Equal(t, ScopeAppPass, c.Scope)
	}
	require.Len(t, s.verified, 1)

	_, err = s.parse(sess.AccessJwt, typAccess, ScopeAccess)
	require.True(t, errors.Is(err, ErrInvalidToken), "app-password token accepted for a full-access method: %v", err)
	_, err = s.parse(sess.AccessJwt, typRefresh, ScopeAppPass)
	require.True(t, errors.Is(err, ErrInvalidToken), "access token accepted as a refresh token: %v", err)

	now = now.Add(time.Hour)
	_, err = s.parse(sess.AccessJwt, typAccess, ScopeAccess, ScopeAppPass)
	require.True(t, errors.Is(err, ErrExpiredToken), "expired remembered token accepted: %v", err)
}
