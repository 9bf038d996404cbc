// Package keyring derives the server's signing keys from its secret, one
// key per named purpose, and signs values with their purpose inside the
// MAC. A value signed for one purpose is refused as a value of any other:
// a console login attempt is no console session, a CSRF token no cookie.
//
// Keys are HKDF-SHA256 (crypto/hkdf) with the server secret as input key
// material and the purpose's label as info, so the secret itself is never
// an HMAC key here. Every purpose is declared in this file, so a new
// signed value cannot be written without naming one, and a reader sees
// them all in one place.
package keyring

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"
)

// MinSecretLen is the shortest secret New accepts.
const MinSecretLen = 32

// KeyLen is the length of every derived key.
const KeyLen = 32

// Errors.
var (
	// ErrShortSecret means the secret is shorter than MinSecretLen.
	ErrShortSecret = errors.New("keyring: secret shorter than 32 bytes")
	// ErrInvalid means a sealed value is malformed, was not sealed for
	// this purpose with this ring, or has expired.
	ErrInvalid = errors.New("keyring: invalid or expired value")
)

// Purpose names what a key or a signed value is for. The zero Purpose is
// no purpose: using it panics.
type Purpose struct{ label string }

// String is the purpose's label (the HKDF info).
func (p Purpose) String() string { return p.label }

// The purposes. The OAuth labels are the ones its keys were derived with
// before this package existed, so access tokens and pages already handed
// out stay valid across an upgrade.
var (
	// ConsoleSession is the operator console's session cookie.
	ConsoleSession = Purpose{"bulwark console session v2"}
	// ConsoleLogin is the console's login-attempt cookie, which the login
	// form's CSRF token is bound to. It stands for nothing after a login.
	ConsoleLogin = Purpose{"bulwark console login attempt v2"}
	// ConsoleSessionCSRF is the CSRF token of the console's forms in a
	// session.
	ConsoleSessionCSRF = Purpose{"bulwark console session csrf v2"}
	// ConsoleLoginCSRF is the CSRF token of the console's login form.
	ConsoleLoginCSRF = Purpose{"bulwark console login csrf v2"}
	// OAuthAccessToken is the HS256 key of OAuth access tokens.
	OAuthAccessToken = Purpose{"bulwark oauth access token"}
	// OAuthCSRF is the key of the OAuth pages' CSRF tokens.
	OAuthCSRF = Purpose{"bulwark oauth csrf"}
	// OAuthDPoPNonce is the key of the DPoP nonces.
	OAuthDPoPNonce = Purpose{"bulwark oauth dpop nonce"}
	// ClusterHint is the key of the commit hints nodes send each other
	// (cluster/hints.go).
	ClusterHint = Purpose{"bulwark cluster commit hint"}
)

// Purposes lists every purpose, for tests that check they are distinct.
func Purposes() []Purpose {
	return []Purpose{ConsoleSession, ConsoleLogin, ConsoleSessionCSRF, ConsoleLoginCSRF, OAuthAccessToken, OAuthCSRF, OAuthDPoPNonce, ClusterHint}
}

// Ring derives keys from one secret. Immutable; safe for concurrent use.
type Ring struct {
	secret []byte
	// binding, when set, is mixed into every key (With).
	binding []byte
}

// New returns a ring over secret (at least MinSecretLen bytes; copied).
func New(secret []byte) (*Ring, error) {
	if len(secret) < MinSecretLen {
		return nil, ErrShortSecret
	}
	return &Ring{secret: append([]byte(nil), secret...)}, nil
}

// MustNew is New for secrets already checked; it panics on a short one.
func MustNew(secret []byte) *Ring {
	r, err := New(secret)
	if err != nil {
		panic(err)
	}
	return r
}

// With returns a ring whose every key also depends on v: the console binds
// its keys to the admin password, so that a new password ends every
// console session.
func (r *Ring) With(v string) *Ring {
	h := sha256.New()
	h.Write(r.binding)
	h.Write([]byte(v))
	return &Ring{secret: r.secret, binding: h.Sum(nil)}
}

// Key returns the key of purpose p, for code that needs a raw key (a JWT
// signer, the DPoP nonce MAC). Prefer Seal and Tag.
func (r *Ring) Key(p Purpose) []byte {
	if p.label == "" {
		panic("keyring: the zero Purpose")
	}
	info := p.label
	if r.binding != nil {
		info += "\x00" + string(r.binding)
	}
	k, err := hkdf.Key(sha256.New, r.secret, nil, info, KeyLen)
	if err != nil {
		panic("keyring: hkdf: " + err.Error()) // only for absurd lengths
	}
	return k
}

// mac is HMAC-SHA256 under p's key of p's label and each part, each part
// length-prefixed so that no two lists of parts sign the same bytes.
func (r *Ring) mac(p Purpose, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, r.Key(p))
	m.Write([]byte(p.label))
	m.Write([]byte{0})
	var n [4]byte
	for _, part := range parts {
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		m.Write(n[:])
		m.Write(part)
	}
	return m.Sum(nil)
}

// Tag returns a MAC of data for purpose p: a token a page carries to prove
// this server rendered it for data (a CSRF token bound to a session id).
func (r *Ring) Tag(p Purpose, data ...[]byte) string {
	return base64.RawURLEncoding.EncodeToString(r.mac(p, data...))
}

// CheckTag reports, in constant time, whether tag is Tag(p, data...).
func (r *Ring) CheckTag(p Purpose, tag string, data ...[]byte) bool {
	if len(tag) > base64.RawURLEncoding.EncodedLen(sha256.Size) {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(tag)
	return err == nil && hmac.Equal(got, r.mac(p, data...))
}

// sealVersion is the first byte of every sealed value.
const sealVersion = 1

// MaxSealed bounds the length of a sealed value Open reads.
const MaxSealed = 4096

// Seal returns payload signed for purpose p until expires, URL-safe
// base64: readable by anyone, forgeable by no one without the secret.
func (r *Ring) Seal(p Purpose, payload []byte, expires time.Time) string {
	buf := make([]byte, 0, 1+8+len(payload)+sha256.Size)
	buf = append(buf, sealVersion)
	buf = binary.BigEndian.AppendUint64(buf, uint64(expires.Unix()))
	buf = append(buf, payload...)
	buf = append(buf, r.mac(p, buf)...)
	return base64.RawURLEncoding.EncodeToString(buf)
}

// Open returns the payload of value and its expiry if Seal made it for p
// with this ring and it has not expired at now. Anything else is
// ErrInvalid.
func (r *Ring) Open(p Purpose, value string, now time.Time) (payload []byte, expires time.Time, err error) {
	if len(value) > MaxSealed {
		return nil, time.Time{}, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(raw) < 1+8+sha256.Size || raw[0] != sealVersion {
		return nil, time.Time{}, ErrInvalid
	}
	body, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(sum, r.mac(p, body)) {
		return nil, time.Time{}, ErrInvalid
	}
	expires = time.Unix(int64(binary.BigEndian.Uint64(body[1:9])), 0)
	if !now.Before(expires) {
		return nil, time.Time{}, ErrInvalid
	}
	return body[9:], expires, nil
}
