package pds

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipld/go-car"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
)

// reserveSigningKey, as the reference PDS: anyone may ask; with a DID the
// same key every time (and the one createAccount for that DID signs with),
// without one a fresh key each time.
func TestReserveSigningKey(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	const nsid = "com.atproto.server.reserveSigningKey"
	did := "did:plc:ewvi7nxzyoun6zhxrhs64oiz"

	a := e.post(t, nsid, "", map[string]any{"did": did}).ok(t).str(t, "signingKey")
	b := e.post(t, nsid, "", map[string]any{"did": did}).ok(t).str(t, "signingKey")
	require.Equal(t, a, b, "a DID's reserved key is the same each time")
	_, err := atcrypto.ParsePublicDIDKey(a)
	require.NoError(t, err)
	other := e.post(t, nsid, "", map[string]any{"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}).ok(t).str(t, "signingKey")
	require.NotEqual(t, a, other)

	x := e.post(t, nsid, "", map[string]any{}).ok(t).str(t, "signingKey")
	y := e.do(t, http.MethodPost, nsid, "", nil, nil, nil).ok(t).str(t, "signingKey")
	require.NotEqual(t, x, y, "without a DID each key is new")
	require.NotEqual(t, a, x)

	e.post(t, nsid, "", map[string]any{"did": "not a did"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, nsid, "", map[string]any{"did": 7}).fails(t, http.StatusBadRequest, "InvalidRequest")

	// createAccount for an existing DID (an account moving here) signs
	// with the key reserved for it.
	acct, _, err := e.accounts.CreateAccount(context.Background(), account.CreateInput{
		DID: did, Handle: "mover.test", Email: "mover@example.com", Password: "correct horse battery",
		ServiceAuth: &account.ServiceAuthUse{Purpose: createAccountNSID, Issuer: did, ID: "reserve-test", Expires: time.Now().Add(time.Minute)},
	})
	require.NoError(t, err)
	pub, err := e.accounts.PublicKey(context.Background(), acct.DID)
	require.NoError(t, err)
	require.Equal(t, a, pub.DIDKey())
	res := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": did, "password": "correct horse battery"}).ok(t)
	creds := e.get(t, "com.atproto.identity.getRecommendedDidCredentials", res.str(t, "accessJwt"), nil).ok(t).json(t)
	require.Equal(t, a, creds["verificationMethods"].(map[string]any)["atproto"])
}

func TestCheckSignupQueue(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	const nsid = "com.atproto.temp.checkSignupQueue"
	out := e.get(t, nsid, u.access, nil).ok(t).json(t)
	require.Equal(t, map[string]any{"activated": true}, out)
	e.get(t, nsid, "", nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.get(t, nsid, "garbage", nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.deactivateAccount", u.access, nil).ok(t)
	e.get(t, nsid, u.access, nil).ok(t)
}

// getCheckout is getRepo without since; getHead is the current commit.
// Both follow getRepo's availability rules.
func TestGetCheckoutAndHead(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post("checked out"),
	}).ok(t)
	q := url.Values{"did": {u.did.String()}}
	latest := e.get(t, "com.atproto.sync.getLatestCommit", "", q).ok(t).str(t, "cid")

	head := e.get(t, "com.atproto.sync.getHead", "", q).ok(t).json(t)
	require.Equal(t, map[string]any{"root": latest}, head)

	co := e.get(t, "com.atproto.sync.getCheckout", "", q).ok(t)
	require.Equal(t, carContentType, co.header.Get("Content-Type"))
	rd, err := car.NewCarReader(bytes.NewReader(co.body))
	require.NoError(t, err)
	require.Equal(t, latest, rd.Header.Roots[0].String())
	whole := e.get(t, "com.atproto.sync.getRepo", "", q).ok(t)
	require.Equal(t, whole.body, co.body, "getCheckout is the whole repository, as getRepo answers it")
	// A since parameter is not getCheckout's: still the whole repository.
	q2 := url.Values{"did": {u.did.String()}, "since": {syntax.NewTIDNow(0).String()}}
	require.Equal(t, whole.body, e.get(t, "com.atproto.sync.getCheckout", "", q2).ok(t).body)

	nobody := url.Values{"did": {"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}}
	e.get(t, "com.atproto.sync.getHead", "", nobody).fails(t, http.StatusBadRequest, "RepoNotFound")
	e.get(t, "com.atproto.sync.getCheckout", "", nobody).fails(t, http.StatusBadRequest, "RepoNotFound")
	e.get(t, "com.atproto.sync.getHead", "", url.Values{"did": {"nope"}}).fails(t, http.StatusBadRequest, "InvalidRequest")

	e.post(t, "com.atproto.server.deactivateAccount", u.access, nil).ok(t)
	e.get(t, "com.atproto.sync.getHead", "", q).fails(t, http.StatusBadRequest, "RepoDeactivated")
	e.get(t, "com.atproto.sync.getCheckout", "", q).fails(t, http.StatusBadRequest, "RepoDeactivated")
	// Its owner still may (to move away), as with getRepo.
	e.get(t, "com.atproto.sync.getHead", u.access, q).ok(t)
	e.get(t, "com.atproto.sync.getCheckout", u.access, q).ok(t)
}

// An account created with a recoveryKey has it first among its DID's
// rotation keys, ahead of the server's.
func TestCreateAccountRecoveryKey(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	recovery, err := atcrypto.GeneratePrivateKeyP256()
	require.NoError(t, err)
	pub, err := recovery.PublicKey()
	require.NoError(t, err)
	res := e.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "recovers.test", "email": "recovers@example.com", "password": "correct horse battery",
		"recoveryKey": pub.DIDKey(),
	}).ok(t)
	did := res.str(t, "did")
	log := e.plc.Log(did)
	require.Len(t, log, 1)
	genesis := log[0].Operation.Regular
	require.NotNil(t, genesis)
	require.Equal(t, []string{pub.DIDKey(), e.accounts.RotationKey()}, genesis.RotationKeys)

	// The server still manages the DID (a handle change is signed with
	// its key, second in the list).
	e.post(t, "com.atproto.identity.updateHandle", res.str(t, "accessJwt"), map[string]any{"handle": "recovers2.test"}).ok(t)
	require.Len(t, e.plc.Log(did), 2)

	before := e.rowCounts(t)
	for _, bad := range []string{"did:key:zNotAKey", "not a key", "did:web:example.com", pub.DIDKey() + "x"} {
		e.post(t, "com.atproto.server.createAccount", "", map[string]any{
			"handle": "badkey.test", "email": "badkey@example.com", "password": "correct horse battery", "recoveryKey": bad,
		}).fails(t, http.StatusBadRequest, "InvalidRequest")
	}
	require.Equal(t, before, e.rowCounts(t), "a refused recovery key stores nothing")
	// Without one, the server's key alone.
	plain := e.createUser(t)
	require.Equal(t, []string{e.accounts.RotationKey()}, e.plc.Log(plain.did.String())[0].Operation.Regular.RotationKeys)
}
