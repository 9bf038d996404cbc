package account

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Service-auth token lifetimes, as the reference PDS bounds them.
const (
	// ServiceAuthDefaultTTL is the lifetime when the caller asks none.
	ServiceAuthDefaultTTL = time.Minute
	// ServiceAuthMaxTTL bounds a token bound to one method (lxm).
	ServiceAuthMaxTTL = time.Hour
	// ServiceAuthMaxTTLNoMethod bounds a token valid for any method.
	ServiceAuthMaxTTLNoMethod = time.Minute
)

// serviceAuthClaims are the claims of an inter-service JWT. aud is a single
// string, as the reference implementation writes and checks it.
type serviceAuthClaims struct {
	Iss string `json:"iss"`
	Aud string `json:"aud"`
	Exp int64  `json:"exp"`
	Iat int64  `json:"iat"`
	Jti string `json:"jti"`
	Lxm string `json:"lxm,omitempty"`
}

// ServiceAuthToken signs a service-auth JWT for iss with its repository
// signing key (ES256K): aud is the receiving service's DID (optionally
// with a #service fragment), lxm the one method it is good for ("" for
// any, then only for ServiceAuthMaxTTLNoMethod), ttl its lifetime.
// Proxying and com.atproto.server.getServiceAuth both use it.
func (s *Service) ServiceAuthToken(ctx context.Context, iss syntax.DID, aud, lxm string, ttl time.Duration) (string, error) {
	key, err := s.keys.SigningKey(ctx, iss)
	if err != nil {
		return "", err
	}
	now := s.cfg.Now()
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return signServiceAuth(key, serviceAuthClaims{
		Iss: iss.String(), Aud: aud, Iat: now.Unix(), Exp: now.Add(ttl).Unix(), Jti: hex.EncodeToString(nonce), Lxm: lxm,
	})
}

func signServiceAuth(key atcrypto.PrivateKey, c serviceAuthClaims) (string, error) {
	var alg string
	switch key.(type) {
	case *atcrypto.PrivateKeyK256:
		alg = "ES256K"
	case *atcrypto.PrivateKeyP256:
		alg = "ES256"
	default:
		return "", fmt.Errorf("account: cannot sign service auth with a %T", key)
	}
	hdr, err := json.Marshal(map[string]string{"typ": "JWT", "alg": alg})
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	b64 := base64.RawURLEncoding
	input := b64.EncodeToString(hdr) + "." + b64.EncodeToString(body)
	// HashAndSign hashes with SHA-256 and returns the 64-byte compact,
	// low-S signature JWS wants for ES256K/ES256.
	sig, err := key.HashAndSign([]byte(input))
	if err != nil {
		return "", err
	}
	return input + "." + b64.EncodeToString(sig), nil
}
