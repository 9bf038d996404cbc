package oauth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// confidential makes c a private_key_jwt client with one ES256 key.
func (c *rawClient) confidential() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(c.t, err)
	pub, err := json.Marshal(jose.JSONWebKey{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"})
	require.NoError(c.t, err)
	path := c.clientID[len(c.f.srv.URL):]
	md := map[string]any{
		"client_id": c.clientID, "application_type": "web", "grant_types": []string{"authorization_code", "refresh_token"},
		"scope": c.scope, "response_types": []string{"code"}, "redirect_uris": []string{c.redirect},
		"token_endpoint_auth_method": "private_key_jwt", "token_endpoint_auth_signing_alg": "ES256",
		"dpop_bound_access_tokens": true, "jwks_uri": c.f.srv.URL + path + ".jwks",
	}
	c.f.putDoc(path, md)
	c.f.putDoc(path+".jwks", map[string]any{"keys": []json.RawMessage{pub}})
	return key
}

func assertion(t *testing.T, key *ecdsa.PrivateKey, claims map[string]any) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	require.NoError(t, err)
	payload, err := json.Marshal(claims)
	require.NoError(t, err)
	jws, err := signer.Sign(payload)
	require.NoError(t, err)
	s, err := jws.CompactSerialize()
	require.NoError(t, err)
	return s
}

func TestClientAssertions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("confidential", "atproto")
	key := c.confidential()
	claims := func() map[string]any {
		return map[string]any{"iss": c.clientID, "sub": c.clientID, "aud": f.srv.URL, "jti": randomString(), "iat": time.Now().Unix()}
	}
	push := func(a string) answer {
		form := c.parForm()
		if a != "" {
			form.Set("client_assertion_type", indigo.ClientAssertionJWTBearer)
			form.Set("client_assertion", a)
		}
		return c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
	}

	good := assertion(t, key, claims())
	require.Equal(t, http.StatusCreated, push(good).status)
	replayed := push(good)
	require.Equal(t, "invalid_client", replayed.str("error"))
	require.Contains(t, replayed.str("error_description"), "already used")

	require.Equal(t, "invalid_client", push("").str("error"), "a confidential client must authenticate")
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.Equal(t, "invalid_client", push(assertion(t, other, claims())).str("error"), "unknown key")
	for name, edit := range map[string]func(map[string]any){
		"wrong aud": func(m map[string]any) { m["aud"] = "https://elsewhere.example" },
		"wrong iss": func(m map[string]any) { m["iss"] = "https://elsewhere.example/client.json" },
		"no jti":    func(m map[string]any) { delete(m, "jti") },
		"old iat":   func(m map[string]any) { m["iat"] = time.Now().Add(-time.Hour).Unix() },
		"expired":   func(m map[string]any) { m["exp"] = time.Now().Add(-time.Minute).Unix() },
	} {
		m := claims()
		edit(m)
		require.Equal(t, "invalid_client", push(assertion(t, key, m)).str("error"), name)
	}

	// The whole flow, then a refresh with a fresh assertion.
	form := c.parForm()
	form.Set("client_assertion_type", indigo.ClientAssertionJWTBearer)
	form.Set("client_assertion", assertion(t, key, claims()))
	uri := c.par(form)
	q := url.Values{"client_id": {c.clientID}, "request_uri": {uri}}
	params := f.browser().SignInAndApprove(f.srv.URL+oauth.PathAuthorize+"?"+q.Encode(), "alice.test", "alice password")
	tok := url.Values{"grant_type": {"authorization_code"}, "client_id": {c.clientID}, "code": {params.Get("code")},
		"redirect_uri": {c.redirect}, "code_verifier": {c.verifier},
		"client_assertion_type": {indigo.ClientAssertionJWTBearer}, "client_assertion": {assertion(t, key, claims())}}
	a := c.post(oauth.PathToken, tok.Encode(), c.proof(oauth.PathToken))
	require.Equal(t, http.StatusOK, a.status, a.body)
	ref := url.Values{"grant_type": {"refresh_token"}, "client_id": {c.clientID}, "refresh_token": {a.str("refresh_token")},
		"client_assertion_type": {indigo.ClientAssertionJWTBearer}, "client_assertion": {assertion(t, key, claims())}}
	a = c.post(oauth.PathToken, ref.Encode(), c.proof(oauth.PathToken))
	require.Equal(t, http.StatusOK, a.status, a.body)
	// Without the assertion the session's refresh is refused.
	a = c.refresh(a.str("refresh_token"))
	require.Equal(t, "invalid_client", a.str("error"))
}
