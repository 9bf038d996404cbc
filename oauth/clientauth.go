package oauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"net/url"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/go-jose/go-jose/v4"

	"github.com/bulwark-pds/bulwark/oauth/dpop"
)

// Client assertion limits.
const (
	// assertionMaxAge is how old an assertion's iat may be; the profile
	// asks servers to accept ones younger than a minute.
	assertionMaxAge = 5 * time.Minute
	// assertionLeeway allows client clocks running ahead.
	assertionLeeway = 30 * time.Second
	maxAssertionLen = 8192
)

// authenticateClient checks the client authentication of a PAR, token or
// revocation request: nothing for public clients, a private_key_jwt
// assertion for confidential ones. The assertion's jti is recorded so it
// cannot be used twice.
func (s *Server) authenticateClient(ctx context.Context, c *client, form url.Values) (clientAuth, error) {
	typ, assertion := form.Get("client_assertion_type"), form.Get("client_assertion")
	if !c.confidential() {
		if typ != "" || assertion != "" {
			return clientAuth{}, invalidClient("this client is registered as public (token_endpoint_auth_method none) and must not send a client assertion")
		}
		return clientAuth{Method: "none"}, nil
	}
	if typ != indigo.ClientAssertionJWTBearer {
		return clientAuth{}, invalidClient("client_assertion_type must be %s", indigo.ClientAssertionJWTBearer)
	}
	if assertion == "" || len(assertion) > maxAssertionLen {
		return clientAuth{}, invalidClient("client_assertion is required for this client")
	}
	jws, err := jose.ParseSignedCompact(assertion, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil || len(jws.Signatures) != 1 {
		return clientAuth{}, invalidClient("client_assertion is not an ES256 JWT")
	}
	kid := jws.Signatures[0].Protected.KeyID
	key, payload, err := verifyWithKeys(jws, c.Keys, kid)
	if err != nil {
		return clientAuth{}, invalidClient("client_assertion signature does not verify with the client's keys")
	}
	jti, exp, err := s.checkAssertionClaims(payload, c.ID)
	if err != nil {
		return clientAuth{}, err
	}
	if err := useValue(ctx, s.db, "client-assertion", c.ID+"\x00"+jti, exp); err != nil {
		if errors.Is(err, errReused) {
			return clientAuth{}, invalidClient("client_assertion was already used")
		}
		return clientAuth{}, serverError(err)
	}
	jkt, err := dpop.Thumbprint(key)
	if err != nil {
		return clientAuth{}, invalidClient("client key: %v", err)
	}
	return clientAuth{Method: "private_key_jwt", KeyID: key.KeyID, Alg: string(jose.ES256), JKT: jkt}, nil
}

// verifyWithKeys verifies jws with the key named kid or, without a kid,
// with whichever P-256 key fits.
func verifyWithKeys(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) (*jose.JSONWebKey, []byte, error) {
	for i := range keys {
		k := &keys[i]
		if kid != "" && k.KeyID != kid {
			continue
		}
		if pub, ok := k.Key.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != string(jose.ES256) {
			continue
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if payload, err := jws.Verify(k); err == nil {
			return k, payload, nil
		}
	}
	return nil, nil, errors.New("no key verifies the assertion")
}

// checkAssertionClaims checks iss, sub, aud, iat, exp and jti (RFC 7523
// and the atproto profile) and returns the jti and how long to remember
// it.
func (s *Server) checkAssertionClaims(payload []byte, clientID string) (string, time.Time, error) {
	var c struct {
		Iss string          `json:"iss"`
		Sub string          `json:"sub"`
		Aud json.RawMessage `json:"aud"`
		JTI string          `json:"jti"`
		IAT *float64        `json:"iat"`
		Exp *float64        `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", time.Time{}, invalidClient("client_assertion claims are not valid JSON")
	}
	if c.Iss != clientID || c.Sub != clientID {
		return "", time.Time{}, invalidClient("client_assertion iss and sub must be the client_id")
	}
	if !audienceIncludes(c.Aud, s.cfg.Issuer) {
		return "", time.Time{}, invalidClient("client_assertion aud must be the issuer %s", s.cfg.Issuer)
	}
	if c.JTI == "" || len(c.JTI) > 256 {
		return "", time.Time{}, invalidClient("client_assertion needs a jti")
	}
	now := s.cfg.Now()
	if c.IAT == nil {
		return "", time.Time{}, invalidClient("client_assertion needs an iat")
	}
	iat := time.Unix(int64(*c.IAT), 0)
	if iat.Before(now.Add(-assertionMaxAge)) || iat.After(now.Add(assertionLeeway)) {
		return "", time.Time{}, invalidClient("client_assertion iat is too old or in the future")
	}
	if c.Exp != nil {
		exp := time.Unix(int64(*c.Exp), 0)
		if !exp.After(now.Add(-assertionLeeway)) {
			return "", time.Time{}, invalidClient("client_assertion has expired")
		}
	}
	// Past this the iat check refuses the assertion whatever its exp says,
	// so the jti need not be remembered longer (and a far exp cannot keep
	// a row for years).
	return c.JTI, iat.Add(assertionMaxAge + assertionLeeway), nil
}

// audienceIncludes accepts aud as a string or an array of strings.
func audienceIncludes(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		for _, a := range many {
			if a == want {
				return true
			}
		}
	}
	return false
}

// sameClientKey reports whether a later request authenticated the way the
// session started: the profile binds a confidential client's session to
// the key (kid, alg and thumbprint) used at the start.
func sameClientKey(start, now clientAuth) bool {
	return start.Method == now.Method && start.KeyID == now.KeyID && start.Alg == now.Alg && start.JKT == now.JKT
}

// keyStillPublished reports whether the session's client key is still in
// the client's (re-fetched) key set.
func keyStillPublished(c *client, a clientAuth) bool {
	for i := range c.Keys {
		jkt, err := dpop.Thumbprint(&c.Keys[i])
		if err == nil && jkt == a.JKT {
			return true
		}
	}
	return false
}
