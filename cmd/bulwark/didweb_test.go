package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// webHost serves one did:web document, did:web:localhost%3A<port>, which
// the test (its holder) rewrites.
type webHost struct {
	did syntax.DID
	mu  sync.Mutex
	doc []byte
}

func startWebHost(t *testing.T) *webHost {
	t.Helper()
	h := &webHost{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		doc := h.doc
		h.mu.Unlock()
		if r.URL.Path != "/.well-known/did.json" || doc == nil {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(doc)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	h.did = syntax.DID("did:web:localhost%3A" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	return h
}

// publish makes the document name pds and signingKey, and handle.
func (h *webHost) publish(t *testing.T, handle, pds, signingKey string) {
	t.Helper()
	pub, err := atcrypto.ParsePublicDIDKey(signingKey)
	require.NoError(t, err)
	d := h.did.String()
	b, err := json.Marshal(map[string]any{
		"id": d, "alsoKnownAs": []string{"at://" + handle},
		"verificationMethod": []map[string]any{{"id": d + "#atproto", "type": "Multikey", "controller": d, "publicKeyMultibase": pub.Multibase()}},
		"service":            []map[string]any{{"id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": pds}},
	})
	require.NoError(t, err)
	h.mu.Lock()
	h.doc = b
	h.mu.Unlock()
}

// publishRecommended points the document at base with the credentials
// base recommends to the session access.
func (h *webHost) publishRecommended(t *testing.T, base, access, handle string) map[string]any {
	t.Helper()
	status, creds, raw := parityCall(t, base, http.MethodGet, "com.atproto.identity.getRecommendedDidCredentials", access, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	key := creds["verificationMethods"].(map[string]any)["atproto"].(string)
	pds := creds["services"].(map[string]any)["atproto_pds"].(map[string]any)["endpoint"].(string)
	require.Equal(t, base, pds)
	h.publish(t, handle, pds, key)
	return creds
}

// startLocal runs the binary as the README does (a local host name, the
// development PLC), its outbound client allowed to reach loopback (where
// the did:web host listens), and returns its URL.
func startLocal(t *testing.T, bin string) string {
	t.Helper()
	port := freePort(t)
	base := "http://localhost:" + strconv.Itoa(port)
	startBinary(t, bin, base, append(cleanEnv(),
		"BULWARK_DATABASE_URL="+dbtest.NewURL(t), "BULWARK_DATA_DIR="+filepath.Join(t.TempDir(), "data"),
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port), "BULWARK_LOG_FORMAT=text",
		"BULWARK_PROXY_ALLOW_PRIVATE=127.0.0.0/8"))
	return base
}

// webCall is an XRPC call that must answer want; it returns the JSON answer.
func webCall(t *testing.T, base, method, nsid, token string, in any, q url.Values, want int) map[string]any {
	t.Helper()
	status, out, raw := parityCall(t, base, method, nsid, token, in, q)
	require.Equal(t, want, status, "%s: %s", nsid, raw)
	return out
}

// TestServeDIDWebMoveAndPLCOp runs two servers as the README runs them
// and, from outside: brings a did:web (did:web:localhost%3A<port>, its
// did.json served by the test over http, which --proxy-allow-private
// lets the servers reach) to the first with a service-auth JWT its holder
// signs, activates it once did.json names the server, moves it to the
// second with goat's calls and the holder's edit of did.json, checks the
// first marked it moved away (a move back replaces it); and creates an
// account on the first from a genesis operation its holder signed
// (plcOp), refusing one that drops the server's rotation key.
func TestServeDIDWebMoveAndPLCOp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	t.Parallel()
	bin := buildBinary(t)
	a, b := startLocal(t, bin), startLocal(t, bin)
	host := startWebHost(t)
	did := host.did.String()
	get, post := http.MethodGet, http.MethodPost

	// Onto a: the holder's own key signs the createAccount token.
	holder, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	holderPub, err := holder.PublicKey()
	require.NoError(t, err)
	host.publish(t, "webber.test", "https://elsewhere.example.com", holderPub.DIDKey())
	da, ok := describe(a)
	require.True(t, ok)
	lxm := syntax.NSID("com.atproto.server.createAccount")
	token, err := auth.SignServiceAuth(host.did, da.DID, time.Minute, &lxm, holder)
	require.NoError(t, err)
	in := map[string]any{"did": did, "handle": "webber.test", "email": "webber@example.com", "password": "webber password"}
	accessA := webCall(t, a, post, "com.atproto.server.createAccount", token, in, nil, http.StatusOK)["accessJwt"].(string)
	out := webCall(t, a, post, "com.atproto.server.activateAccount", accessA, nil, nil, http.StatusBadRequest)
	require.Equal(t, "InvalidRequest", out["error"])
	credsA := host.publishRecommended(t, a, accessA, "webber.test")
	webCall(t, a, post, "com.atproto.server.activateAccount", accessA, nil, nil, http.StatusOK)
	rec := webCall(t, a, post, "com.atproto.repo.createRecord", accessA, map[string]any{
		"repo": did, "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "from a did:web", "createdAt": time.Now().UTC().Format(time.RFC3339)},
	}, nil, http.StatusOK)

	// To b, with goat's calls; the identity step is the holder's.
	db, ok := describe(b)
	require.True(t, ok)
	q := url.Values{"aud": {db.DID}, "lxm": {string(lxm)}, "exp": {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)}}
	token = webCall(t, a, get, "com.atproto.server.getServiceAuth", accessA, nil, q, http.StatusOK)["token"].(string)
	in["password"] = "b password"
	webCall(t, b, post, "com.atproto.server.createAccount", token, in, nil, http.StatusOK)
	accessB := webCall(t, b, post, "com.atproto.server.createSession", "", map[string]any{"identifier": did, "password": "b password"}, nil, http.StatusOK)["accessJwt"].(string)
	status, _, car := parityCall(t, a, get, "com.atproto.sync.getRepo", accessA, nil, url.Values{"did": {did}})
	require.Equal(t, http.StatusOK, status)
	importCAR(t, b, accessB, car)
	st := webCall(t, b, get, "com.atproto.server.checkAccountStatus", accessB, nil, nil, http.StatusOK)
	require.Equal(t, false, st["validDid"])
	out = webCall(t, a, post, "com.atproto.identity.signPlcOperation", accessA, map[string]any{"token": "unused"}, nil, http.StatusBadRequest)
	require.Equal(t, "InvalidRequest", out["error"])
	host.publishRecommended(t, b, accessB, "webber.test")
	webCall(t, b, post, "com.atproto.server.activateAccount", accessB, nil, nil, http.StatusOK)
	webCall(t, a, post, "com.atproto.server.deactivateAccount", accessA, map[string]any{}, nil, http.StatusOK)

	got := webCall(t, b, get, "com.atproto.repo.getRecord", "", nil, url.Values{"repo": {did}, "collection": {"app.bsky.feed.post"}, "rkey": {path.Base(rec["uri"].(string))}}, http.StatusOK)
	require.Equal(t, rec["cid"], got["cid"])
	st = webCall(t, b, get, "com.atproto.server.checkAccountStatus", accessB, nil, nil, http.StatusOK)
	require.Equal(t, true, st["validDid"])
	require.Equal(t, true, st["activated"])
	old := webCall(t, a, get, "com.atproto.sync.getRepoStatus", "", nil, url.Values{"did": {did}}, http.StatusOK)
	require.Equal(t, "deactivated", old["status"])

	// a recorded the move away: a move back replaces its account.
	q.Set("aud", da.DID)
	token = webCall(t, b, get, "com.atproto.server.getServiceAuth", accessB, nil, q, http.StatusOK)["token"].(string)
	in["password"] = "back password"
	webCall(t, a, post, "com.atproto.server.createAccount", token, in, nil, http.StatusOK)
	webCall(t, a, post, "com.atproto.server.createSession", "", map[string]any{"identifier": did, "password": "back password"}, nil, http.StatusOK)

	// A genesis operation its holder signed, naming a's rotation key.
	rot, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	rotPub, err := rot.PublicKey()
	require.NoError(t, err)
	key := webCall(t, a, post, "com.atproto.server.reserveSigningKey", "", map[string]any{"did": rotPub.DIDKey()}, nil, http.StatusOK)["signingKey"].(string)
	serverKey := credsA["rotationKeys"].([]any)[0].(string)
	genesis := func(rotationKeys ...string) map[string]any {
		op := &didplc.RegularOp{
			Type: "plc_operation", RotationKeys: rotationKeys, VerificationMethods: map[string]string{"atproto": key},
			AlsoKnownAs: []string{"at://genesis.test"},
			Services:    map[string]didplc.OpService{"atproto_pds": {Type: "AtprotoPersonalDataServer", Endpoint: a}},
		}
		require.NoError(t, op.Sign(rot))
		b, err := json.Marshal(op)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		return map[string]any{"handle": "genesis.test", "email": "genesis@example.com", "password": "genesis password", "plcOp": m}
	}
	out = webCall(t, a, post, "com.atproto.server.createAccount", "", genesis(rotPub.DIDKey()), nil, http.StatusBadRequest)
	require.Equal(t, "IncompatibleDidDoc", out["error"])
	created := webCall(t, a, post, "com.atproto.server.createAccount", "", genesis(rotPub.DIDKey(), serverKey), nil, http.StatusOK)
	resp, err := http.Get(a + "/" + created["did"].(string) + "/data")
	require.NoError(t, err)
	var data struct {
		RotationKeys []string `json:"rotationKeys"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&data))
	resp.Body.Close()
	require.Equal(t, []string{rotPub.DIDKey(), serverKey}, data.RotationKeys)
	webCall(t, a, post, "com.atproto.repo.createRecord", created["accessJwt"].(string), map[string]any{
		"repo": created["did"], "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "my own genesis", "createdAt": time.Now().UTC().Format(time.RFC3339)},
	}, nil, http.StatusOK)
}

// importCAR posts a repository CAR to base's importRepo.
func importCAR(t *testing.T, base, token string, car []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/com.atproto.repo.importRepo", bytes.NewReader(car))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/vnd.ipld.car")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
}
