package account

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// testUse is a fresh createAccount service-auth use of iss, live a minute.
func testUse(iss syntax.DID) *ServiceAuthUse {
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	return &ServiceAuthUse{Purpose: "com.atproto.server.createAccount", Issuer: iss.String(), ID: hex.EncodeToString(jti), Expires: time.Now().Add(time.Minute)}
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
