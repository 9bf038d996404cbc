package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
	"github.com/bulwark-pds/bulwark/plc"
)

// The anonymous actions of TestAnonymousBurstLeavesBoundedState beyond
// the route bursts: the ones that store rows or cost the server work, each
// from one address until refused.

// parForm is a valid pushed authorization request of the app at clientID.
func parForm(clientID, redirect string) url.Values {
	v := make([]byte, 32)
	_, _ = rand.Read(v)
	verifier := base64.RawURLEncoding.EncodeToString(v)
	sum := sha256.Sum256([]byte(verifier))
	return url.Values{"client_id": {clientID}, "response_type": {"code"}, "redirect_uri": {redirect}, "scope": {"atproto"},
		"state": {verifier + "s"}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
}

// par pushes form with a DPoP proof of key, as an app does.
func (ps *publicServer) par(t *testing.T, c *http.Client, key *dpoptest.Key, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ps.url+oauth.PathPAR, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("DPoP", key.Proof(dpoptest.Claims{Method: http.MethodPost, URL: ps.cfg.PublicURL() + oauth.PathPAR, Nonce: ps.srv.OAuth().DPoPNonce()}))
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		RequestURI string `json:"request_uri"`
	}
	if resp.StatusCode == http.StatusCreated {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	}
	return resp.StatusCode, out.RequestURI
}

// plcGenesisOps submits genesis operations of fresh DIDs (each with keys
// of its own, as anyone may make) to the development PLC from one address
// until refused.
func (ps *publicServer) plcGenesisOps(t *testing.T, acct inputAccount) int {
	return untilRefused(t, 30, func(c *http.Client) int {
		key, err := atcrypto.GeneratePrivateKeyK256()
		require.NoError(t, err)
		pub, err := key.PublicKey()
		require.NoError(t, err)
		pc, err := plc.NewClient(ps.url, key, c)
		require.NoError(t, err)
		did, op, err := pc.Genesis(plc.Identity{Handle: syntax.Handle("genesis" + strconv.FormatInt(freshSeq.Add(1), 36) + acct.domain),
			SigningKey: pub, PDSEndpoint: "https://pds.example.com"})
		require.NoError(t, err)
		body, err := json.Marshal(op)
		require.NoError(t, err)
		resp, err := c.Post(ps.url+"/"+did.String(), "application/json", strings.NewReader(string(body)))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}, func(s int) bool { return s == http.StatusOK })
}

// foreignHandles asks to resolve handles hosted elsewhere (each a DNS and
// an HTTPS lookup for the server), from one address until refused.
func (ps *publicServer) foreignHandles(t *testing.T) {
	untilRefused(t, 10, func(c *http.Client) int {
		h := "nobody" + strconv.FormatInt(freshSeq.Add(1), 36) + ".example.com"
		return ps.xrpcJSON(t, c, "com.atproto.identity.resolveHandle?handle="+h, nil, nil, nil)
	}, func(int) bool { return true })
}

// firehoseUpgrades opens subscribeRepos WebSockets from one address, old
// cursor and none, until admission refuses.
func (ps *publicServer) firehoseUpgrades(t *testing.T) {
	base := "ws" + strings.TrimPrefix(ps.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	untilRefused(t, 20, func(c *http.Client) int {
		d := websocket.Dialer{NetDialContext: c.Transport.(*http.Transport).DialContext}
		u := base
		if freshSeq.Add(1)%2 == 0 {
			u += "?cursor=0"
		}
		conn, resp, err := d.Dial(u, nil)
		if err == nil {
			conn.Close()
			return http.StatusSwitchingProtocols
		}
		require.NotNil(t, resp, err)
		return resp.StatusCode
	}, func(int) bool { return true })
}

// wrongPasswords signs in with the existing account's handle and a wrong
// password: createSession, the console's login form, the OAuth sign-in
// page, each from one address until refused.
func (ps *publicServer) wrongPasswords(t *testing.T, acct inputAccount) {
	untilRefused(t, 10, func(c *http.Client) int {
		in := map[string]any{"identifier": acct.handle, "password": acct.password}
		return ps.xrpcJSON(t, c, "com.atproto.server.createSession", in, nil, nil)
	}, func(int) bool { return true })
	untilRefused(t, 10, func(c *http.Client) int {
		resp, err := c.Get(ps.url + "/admin/login")
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			return resp.StatusCode
		}
		req, err := http.NewRequest(http.MethodPost, ps.url+"/admin/login", strings.NewReader(url.Values{"password": {acct.password}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", ps.url)
		resp, err = c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}, func(int) bool { return true })
	untilRefused(t, 10, func(c *http.Client) int {
		form := url.Values{"csrf_token": {"forged"}, "action": {"signin"}, "identifier": {acct.handle}, "password": {acct.password}}
		resp, err := c.PostForm(ps.url+oauth.PathAuthorize, form)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}, func(int) bool { return true })
}
