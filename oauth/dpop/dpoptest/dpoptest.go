// Package dpoptest builds DPoP proofs for tests, including malformed ones
// a real client would never send.
package dpoptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/bulwark-pds/bulwark/oauth/dpop"
)

// Key is a client's DPoP key.
type Key struct {
	Private *ecdsa.PrivateKey
}

// NewKey makes a fresh P-256 key.
func NewKey() *Key {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return &Key{Private: k}
}

// JKT is the key's thumbprint.
func (k *Key) JKT() string {
	jwk := jose.JSONWebKey{Key: &k.Private.PublicKey}
	s, err := dpop.Thumbprint(&jwk)
	if err != nil {
		panic(err)
	}
	return s
}

// Claims are a proof's claims. Empty strings are left out, so a test can
// drop any of them.
type Claims struct {
	Method, URL, Nonce, JTI, AccessToken string
	// IssuedAt zero means now.
	IssuedAt time.Time
	// Typ overrides the header type ("" means dpop+jwt).
	Typ string
}

// Proof signs a proof with claims c.
func (k *Key) Proof(c Claims) string {
	if c.IssuedAt.IsZero() {
		c.IssuedAt = time.Now()
	}
	if c.JTI == "" {
		c.JTI = random()
	}
	if c.Typ == "" {
		c.Typ = dpop.HeaderType
	}
	body := map[string]any{"jti": c.JTI, "iat": c.IssuedAt.Unix()}
	if c.Method != "" {
		body["htm"] = c.Method
	}
	if c.URL != "" {
		body["htu"] = c.URL
	}
	if c.Nonce != "" {
		body["nonce"] = c.Nonce
	}
	if c.AccessToken != "" {
		body["ath"] = dpop.AccessTokenHash(c.AccessToken)
	}
	payload, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	opts := (&jose.SignerOptions{EmbedJWK: true}).WithType(jose.ContentType(c.Typ))
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.Private}, opts)
	if err != nil {
		panic(err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		panic(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		panic(err)
	}
	return s
}

func random() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
