package pds

import (
	"net/http"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"
)

// TestDIDWebIssuerRefusals: createAccount for a did:web resolves the
// issuer's document through the guarded client, and each way that fails
// is a 401 with a name and nothing stored: no document, one signed for
// another key, a did.json that redirects (to a private address, never
// reached), one over the size limit, one that never comes. A token that
// worked is refused the second time.
func TestDIDWebIssuerRefusals(t *testing.T) {
	t.Parallel()
	w := newWebWorld(t)
	e := w.env(t, nil)
	aud := e.cfg.ServiceDID()
	in := func(id *webIdentity) map[string]any {
		return map[string]any{"did": id.did, "handle": id.handle, "email": "web-" + id.host + "@example.com", "password": "web password"}
	}
	before := e.rowCounts(t)

	nobody := w.identity(t, "bob.example.com") // publishes nothing
	e.post(t, "com.atproto.server.createAccount", nobody.selfToken(t, aud), in(nobody)).fails(t, http.StatusUnauthorized, "BadJwtIssuer")
	e.post(t, "com.atproto.server.createAccount", "", in(nobody)).fails(t, http.StatusUnauthorized, "AuthenticationRequired")

	forger := w.identity(t, "carol.example.com")
	w.publishSelf(t, forger, "https://elsewhere.example.com")
	other, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	forger.key = other
	e.post(t, "com.atproto.server.createAccount", forger.selfToken(t, aud), in(forger)).fails(t, http.StatusUnauthorized, "BadJwtSignature")

	for _, host := range []string{"redirect.example.com", "huge.example.com", "slow.example.com"} {
		id := w.identity(t, host)
		e.post(t, "com.atproto.server.createAccount", id.selfToken(t, aud), in(id)).fails(t, http.StatusUnauthorized, "BadJwtIssuer")
	}
	require.Zero(t, w.privateRequests(), "the redirect to a private address was not followed")
	require.Equal(t, before, e.rowCounts(t), "nothing stored")

	// A token that created the account is refused when replayed, also for
	// another handle and password.
	id := w.identity(t, "alice.example.com")
	w.publishSelf(t, id, "https://elsewhere.example.com")
	token := id.selfToken(t, aud)
	e.post(t, "com.atproto.server.createAccount", token, in(id)).ok(t)
	again := in(id)
	again["handle"], again["password"] = "mallory.test", "mallory's password"
	e.post(t, "com.atproto.server.createAccount", token, again).fails(t, http.StatusUnauthorized, "JwtReplayed")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": id.did, "password": "web password"}).ok(t)
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": "mallory.test", "password": "mallory's password"}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
}

// TestDIDWebActivation: activateAccount reads the did:web document as it
// stands when it is called, whatever it said when the account was
// created: it must name this server and the account's key here (the
// reference PDS's messages), and checkAccountStatus's validDid follows
// it. A did:web has no PLC operations (named refusals), and its handle
// changes only to what its document declares.
func TestDIDWebActivation(t *testing.T) {
	t.Parallel()
	w := newWebWorld(t)
	e := w.env(t, nil)
	id := w.identity(t, "dave.example.com")
	w.publishSelf(t, id, "https://elsewhere.example.com")
	res := e.post(t, "com.atproto.server.createAccount", id.selfToken(t, e.cfg.ServiceDID()), map[string]any{
		"did": id.did, "handle": id.handle, "email": "dave@example.com", "password": "dave password",
	}).ok(t)
	u := &user{did: id.did, handle: id.handle, pass: "dave password", access: res.str(t, "accessJwt")}
	creds := e.recommended(t, u)
	key := creds["verificationMethods"].(map[string]any)["atproto"].(string)
	own, err := id.key.PublicKey()
	require.NoError(t, err)

	refused := map[string]map[string]any{
		"names another server":             didDoc(id.did, id.handle, "https://elsewhere.example.com", key),
		"names another key":                didDoc(id.did, id.handle, e.cfg.PublicURL(), own.DIDKey()),
		"names this server by another URL": didDoc(id.did, id.handle, e.cfg.PublicURL()+"/xrpc", key),
	}
	for name, doc := range refused {
		w.publish(t, id.host, doc)
		msg := e.post(t, "com.atproto.server.activateAccount", u.access, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
		require.Contains(t, msg, "DID document", name)
		require.Equal(t, false, e.get(t, "com.atproto.server.checkAccountStatus", u.access, nil).ok(t).json(t)["validDid"], name)
	}
	w.publish(t, id.host, map[string]any{"id": "did:web:someone-else.example.com"})
	e.post(t, "com.atproto.server.activateAccount", u.access, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Equal(t, "deactivated", e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "status"))

	w.pointAt(t, e, u, id)
	require.Equal(t, true, e.get(t, "com.atproto.server.checkAccountStatus", u.access, nil).ok(t).json(t)["validDid"])
	e.post(t, "com.atproto.server.activateAccount", u.access, nil).ok(t)
	require.Equal(t, []string{"identity", "account", "sync"}, e.eventKinds(t, id.did))

	// No PLC operation for a did:web.
	for _, nsid := range []string{"com.atproto.identity.signPlcOperation", "com.atproto.identity.submitPlcOperation"} {
		body := map[string]any{"token": "whatever", "operation": map[string]any{"type": "plc_operation"}}
		msg := e.post(t, nsid, u.access, body).fails(t, http.StatusBadRequest, "InvalidRequest")
		require.Contains(t, msg, "not a did:plc", nsid)
	}

	// The handle follows the document: a new name it does not declare
	// is refused, then taken once it does.
	msg := e.post(t, "com.atproto.identity.updateHandle", u.access, map[string]any{"handle": "dave2.test"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "DID is not properly configured for handle")
	id.handle = "dave2.test"
	w.pointAt(t, e, u, id)
	e.post(t, "com.atproto.identity.updateHandle", u.access, map[string]any{"handle": "dave2.test"}).ok(t)
	require.Equal(t, "dave2.test", e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "handle"))

	// Deactivated while the document names this server: not moved away.
	e.post(t, "com.atproto.server.deactivateAccount", u.access, nil).ok(t)
	require.Nil(t, e.movedAwayAt(t, id.did))
}
