package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/internal/devdns"
)

// parityCall makes an XRPC call to the server at base and returns the
// status and the decoded JSON answer (nil for another body).
func parityCall(t *testing.T, base, method, nsid, token string, in any, q url.Values) (int, map[string]any, []byte) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		require.NoError(t, err)
		body = bytes.NewReader(b)
	}
	u := base + "/xrpc/" + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, raw
}

// TestServeReferenceParity runs the binary as the README runs it (a local
// host name, the development PLC inside the server), with an SMTP server,
// a DNS server and an admin password of the test's, and exercises what
// makes it a drop-in for the reference PDS: the methods it used to leave
// to the app view, a recovery key in the genesis operation, email sign-in
// codes, a handle on the user's own domain, and a taken-down account
// leaving with its data.
func TestServeReferenceParity(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	t.Parallel()
	bin := buildBinary(t)
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	dns, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(dns.Close)
	port := freePort(t)
	base := "http://localhost:" + strconv.Itoa(port)
	const adminPassword = "parity-admin-password-for-tests"
	startBinary(t, bin, base, append(cleanEnv(),
		"BULWARK_DATABASE_URL="+dbtest.NewURL(t), "BULWARK_DATA_DIR="+filepath.Join(t.TempDir(), "data"),
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port), "BULWARK_LOG_FORMAT=text",
		"BULWARK_SMTP_URL="+sink.URL(), "BULWARK_EMAIL_FROM=Bulwark <noreply@pds.test>",
		"BULWARK_DNS_SERVER="+dns.Addr, "BULWARK_ADMIN_PASSWORD="+adminPassword))
	call := func(method, nsid, token string, in any, q url.Values) (int, map[string]any) {
		status, out, _ := parityCall(t, base, method, nsid, token, in, q)
		return status, out
	}
	nextCode := func() string { return emailtest.Parse(t, sink.Next(t)).Code(t) }

	// createAccount with a recovery key: first among the rotation keys.
	recovery, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	pub, err := recovery.PublicKey()
	require.NoError(t, err)
	acct := postOK(t, base, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "alice.test", "email": "alice@example.com", "password": "alice password", "recoveryKey": pub.DIDKey(),
	})
	did, access := acct["did"].(string), acct["accessJwt"].(string)
	resp, err := http.Get(base + "/" + did + "/data")
	require.NoError(t, err)
	var data struct {
		RotationKeys []string `json:"rotationKeys"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&data))
	resp.Body.Close()
	require.Len(t, data.RotationKeys, 2)
	require.Equal(t, pub.DIDKey(), data.RotationKeys[0])

	// The four methods it used to forward.
	mine := url.Values{"did": {did}}
	status, out := call(http.MethodGet, "com.atproto.sync.getHead", "", nil, mine)
	require.Equal(t, http.StatusOK, status)
	_, latest := call(http.MethodGet, "com.atproto.sync.getLatestCommit", "", nil, mine)
	require.Equal(t, latest["cid"], out["root"])
	status, _, car := parityCall(t, base, http.MethodGet, "com.atproto.sync.getCheckout", "", nil, mine)
	require.Equal(t, http.StatusOK, status)
	require.NotEmpty(t, car)
	key := postOK(t, base, "com.atproto.server.reserveSigningKey", "", map[string]any{"did": "did:plc:ewvi7nxzyoun6zhxrhs64oiz"})
	require.True(t, strings.HasPrefix(key["signingKey"].(string), "did:key:"))
	status, out = call(http.MethodGet, "com.atproto.temp.checkSignupQueue", access, nil, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, true, out["activated"])

	// Email sign-in codes.
	postOK(t, base, "com.atproto.server.requestEmailConfirmation", access, nil)
	postOK(t, base, "com.atproto.server.confirmEmail", access, map[string]any{"email": "alice@example.com", "token": nextCode()})
	postOK(t, base, "com.atproto.server.requestEmailUpdate", access, nil)
	postOK(t, base, "com.atproto.server.updateEmail", access, map[string]any{"email": "alice@example.com", "emailAuthFactor": true, "token": nextCode()})
	login := map[string]any{"identifier": "alice.test", "password": "alice password"}
	status, out = call(http.MethodPost, "com.atproto.server.createSession", "", login, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "AuthFactorTokenRequired", out["error"])
	login["authFactorToken"] = nextCode()
	sess := postOK(t, base, "com.atproto.server.createSession", "", login)
	require.Equal(t, true, sess["emailAuthFactor"])

	// A handle on the user's own domain, checked in DNS now.
	dns.SetTXT("_atproto.alice.example.org", "did="+did)
	postOK(t, base, "com.atproto.identity.updateHandle", access, map[string]any{"handle": "alice.example.org"})
	status, out = call(http.MethodGet, "com.atproto.identity.resolveHandle", "", nil, url.Values{"handle": {"alice.example.org"}})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, did, out["did"])
	status, out = call(http.MethodPost, "com.atproto.identity.updateHandle", access, map[string]any{"handle": "someone-else.example.org"}, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "InvalidRequest", out["error"])

	// Taken down, the account signs in to leave with its repository.
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/com.atproto.admin.updateSubjectStatus", strings.NewReader(
		`{"subject":{"$type":"com.atproto.admin.defs#repoRef","did":"`+did+`"},"takedown":{"applied":true}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth("admin", adminPassword)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	login = map[string]any{"identifier": did, "password": "alice password", "allowTakendown": true}
	status, out = call(http.MethodPost, "com.atproto.server.createSession", "", login, nil)
	require.Equal(t, "AuthFactorTokenRequired", out["error"], "the factor still applies: %d", status)
	login["authFactorToken"] = nextCode()
	td := postOK(t, base, "com.atproto.server.createSession", "", login)
	require.Equal(t, "takendown", td["status"])
	status, _, car = parityCall(t, base, http.MethodGet, "com.atproto.sync.getRepo", td["accessJwt"].(string), nil, mine)
	require.Equal(t, http.StatusOK, status)
	require.NotEmpty(t, car)
	status, out = call(http.MethodGet, "com.atproto.sync.getRepo", "", nil, mine)
	require.Equal(t, "RepoTakendown", out["error"], "%d", status)
	status, out = call(http.MethodGet, "com.atproto.server.getSession", td["accessJwt"].(string), nil, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "InvalidToken", out["error"])
}
