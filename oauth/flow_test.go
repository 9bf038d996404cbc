package oauth_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

const (
	aliceDID = "did:plc:alice0000000000000000000"
	bobDID   = "did:plc:bob00000000000000000000a"
)

// startFlow sends the PAR as indigo's client does and stores the request
// as StartAuthFlow would, returning the URL to open in the browser.
func (f *fixture) startFlow(app *indigo.ClientApp, did, hint string) string {
	t := f.t
	ctx := context.Background()
	md := f.asMetadata()
	info, err := app.SendAuthRequest(ctx, md, app.Config.Scopes, hint)
	require.NoError(t, err)
	d := syntax.DID(did)
	info.AccountDID = &d
	require.NoError(t, app.Store.SaveAuthRequestInfo(ctx, *info))
	q := url.Values{"client_id": {app.Config.ClientID}, "request_uri": {info.RequestURI}}
	return md.AuthorizationEndpoint + "?" + q.Encode()
}

// resource calls the test resource endpoint through the indigo session
// (DPoP, nonce retries and refresh as a real client does them).
func resource(t *testing.T, f *fixture, sess *indigo.ClientSession, query string) (int, map[string]string) {
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/xrpc/test.resource?"+query, nil)
	require.NoError(t, err)
	resp, err := sess.DoWithAuth(f.srv.Client(), req, syntax.NSID("test.resource"))
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// rawResource calls the resource with the session's current tokens and a
// fresh proof, without indigo's retries.
func rawResource(t *testing.T, f *fixture, sess *indigo.ClientSession) *http.Response {
	u := f.srv.URL + "/xrpc/test.resource"
	proof, err := sess.NewHostDPoP(http.MethodGet, u)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "DPoP "+sess.Data.AccessToken)
	req.Header.Set("DPoP", proof)
	resp, err := f.srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

func TestIndigoClientFullFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	app := f.publicClient("app", []string{"atproto", "transition:generic"})

	authURL := f.startFlow(app, aliceDID, "alice.test")
	params := f.browser().SignInAndApprove(authURL, "alice.test", "alice password")
	require.Equal(t, f.srv.URL, params.Get("iss"))
	require.NotEmpty(t, params.Get("code"))

	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	require.Equal(t, syntax.DID(aliceDID), data.AccountDID)
	require.ElementsMatch(t, []string{"atproto", "transition:generic"}, data.Scopes)

	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)
	status, body := resource(t, f, sess, "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, aliceDID, body["did"])
	require.Equal(t, app.Config.ClientID, body["client_id"])

	oldAccess := sess.Data.AccessToken
	_, err = sess.RefreshTokens(ctx)
	require.NoError(t, err)
	require.NotEqual(t, oldAccess, sess.Data.AccessToken)
	status, _ = resource(t, f, sess, "")
	require.Equal(t, http.StatusOK, status)

	require.NoError(t, sess.RevokeSession(ctx))
	resp := rawResource(t, f, sess)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`)
	_, err = sess.RefreshTokens(ctx)
	require.ErrorContains(t, err, "invalid_grant")
}

func TestConfidentialClientFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	priv := shortP256(t)
	cfg := indigo.NewPublicConfig(f.srv.URL+"/client/conf.json", f.srv.URL+"/callback", []string{"atproto", "transition:generic"})
	require.NoError(t, cfg.SetClientSecret(priv, "key-1"))
	md := cfg.ClientMetadata()
	jwks := cfg.PublicJWKS()
	md.JWKS = &jwks
	f.putDoc("/client/conf.json", md)
	app := f.clientApp(&cfg)

	params := f.browser().SignInAndApprove(f.startFlow(app, bobDID, ""), "bob.test", "bob password")
	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)
	status, body := resource(t, f, sess, "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, bobDID, body["did"])
	_, err = sess.RefreshTokens(ctx)
	require.NoError(t, err)

	// The client stops publishing the key the session is bound to: the
	// session ends at its next refresh (once the cached metadata expires;
	// this fixture's cache is bypassed by a new client_id document).
	other, err := atcrypto.GeneratePrivateKeyP256()
	require.NoError(t, err)
	cfg2 := cfg
	require.NoError(t, cfg2.SetClientSecret(other, "key-2"))
	jwks2 := cfg2.PublicJWKS()
	md.JWKS = &jwks2
	f.putDoc("/client/conf.json", md)
	f.oauth.ForgetClient(cfg.ClientID)
	_, err = sess.RefreshTokens(ctx)
	require.ErrorContains(t, err, "invalid_grant")
	resp := rawResource(t, f, sess)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// shortP256 returns a key whose JWK (as atcrypto writes it) has a
// coordinate shorter than 32 bytes, which strict JWK parsers refuse.
func shortP256(t *testing.T) *atcrypto.PrivateKeyP256 {
	for range 5000 {
		k, err := atcrypto.GeneratePrivateKeyP256()
		require.NoError(t, err)
		pub, err := k.PublicKey()
		require.NoError(t, err)
		jwk, err := pub.JWK()
		require.NoError(t, err)
		if len(jwk.X) < 43 || len(jwk.Y) < 43 {
			return k
		}
	}
	t.Fatal("no short key found")
	return nil
}

func TestLocalhostDevelopmentClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	cfg := indigo.NewLocalhostConfig("http://127.0.0.1/callback", []string{"atproto", "transition:generic"})
	app := f.clientApp(&cfg)
	params := f.browser().SignInAndApprove(f.startFlow(app, aliceDID, ""), "alice.test", "alice password")
	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	require.Equal(t, syntax.DID(aliceDID), data.AccountDID)
}

func TestMetadataDocuments(t *testing.T) {
	t.Parallel()
	f := setup(t)
	md := f.asMetadata()
	require.Equal(t, f.srv.URL, md.Issuer)
	require.True(t, md.RequirePushedAuthorizationRequests)
	require.Equal(t, f.srv.URL+"/oauth/par", md.PushedAuthorizationRequestEndpoint)
	require.Equal(t, []string{"S256"}, md.CodeChallengeMethodsSupported)
	require.ElementsMatch(t, []string{"none", "private_key_jwt"}, md.TokenEndpointAuthMethodsSupoorted)
	require.Equal(t, []string{"ES256"}, md.DPoPSigningAlgValuesSupported)
	require.True(t, md.AuthorizationReponseISSParameterSupported)
	require.True(t, md.ClientIDMetadataDocumentSupported)
	require.Subset(t, md.ScopesSupported, []string{"atproto", "transition:generic", "transition:chat.bsky", "transition:email"})
	require.NotEmpty(t, md.RevocationEndpoint)
	// indigo's validation fails only on the port of the test server's URL.
	err := md.Validate(f.srv.URL)
	require.ErrorContains(t, err, "issuer URL")

	resp, err := f.srv.Client().Get(f.srv.URL + oauth.PathRSMetadata)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"))
	var rs indigo.ProtectedResourceMetadata
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rs))
	require.Equal(t, []string{f.srv.URL}, rs.AuthorizationServers)
}
