package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Cookie names. The session cookie is scoped to Prefix.
const (
	sessionCookie = "bulwark_console"
	loginCookie   = "bulwark_console_login"
)

// csrfField is the name of the hidden field every form carries.
const csrfField = "csrf"

// maxRevoked bounds the sessions remembered as logged out before they
// expire.
const maxRevoked = 10_000

// errBadCookie means a cookie is missing, malformed, expired, revoked or
// not signed by this server.
var errBadCookie = errors.New("no valid console session")

// keys are the MAC keys of sessions and CSRF tokens.
type keys struct {
	session []byte
	csrf    []byte
}

// deriveKeys makes the console's keys from the JWT secret and the admin
// password: a session outlives neither a new secret nor a new password.
func deriveKeys(secret []byte, adminPassword string) keys {
	pw := sha256.Sum256([]byte(adminPassword))
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte("bulwark console " + label + " v1\x00"))
		m.Write(pw[:])
		return m.Sum(nil)
	}
	return keys{session: derive("session"), csrf: derive("csrf")}
}

// session is a logged-in operator's cookie: an id and its lifetime.
type session struct {
	id      [16]byte
	expires time.Time
}

// token layout: 16-byte id, 8-byte expiry (unix seconds), 32-byte MAC.
const tokenLen = 16 + 8 + sha256.Size

func (k keys) mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// encode signs s as a cookie value.
func (k keys) encode(s session) string {
	buf := make([]byte, 0, tokenLen)
	buf = append(buf, s.id[:]...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(s.expires.Unix()))
	buf = append(buf, k.mac(k.session, buf)...)
	return base64.RawURLEncoding.EncodeToString(buf)
}

// decode checks a cookie value's signature and expiry.
func (k keys) decode(v string, now time.Time) (session, error) {
	if len(v) > 2*tokenLen {
		return session{}, errBadCookie
	}
	raw, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(raw) != tokenLen {
		return session{}, errBadCookie
	}
	body, sum := raw[:16+8], raw[16+8:]
	if !hmac.Equal(sum, k.mac(k.session, body)) {
		return session{}, errBadCookie
	}
	var s session
	copy(s.id[:], body[:16])
	s.expires = time.Unix(int64(binary.BigEndian.Uint64(body[16:])), 0)
	if !now.Before(s.expires) {
		return session{}, errBadCookie
	}
	return s, nil
}

// csrfToken is the CSRF token of forms in the session (or login attempt)
// with id: a MAC of the id, so that only pages this server rendered for
// that session carry it.
func (k keys) csrfToken(purpose string, id [16]byte) string {
	return base64.RawURLEncoding.EncodeToString(k.mac(k.csrf, []byte(purpose), id[:]))
}

// checkCSRF compares a submitted token with the expected one in constant
// time.
func (k keys) checkCSRF(purpose string, id [16]byte, got string) bool {
	want := k.csrfToken(purpose, id)
	return len(got) == len(want) && hmac.Equal([]byte(got), []byte(want))
}

func newID() [16]byte {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		panic(err)
	}
	return id
}

// revocations remembers logged-out sessions until they expire, so that a
// copied cookie dies with the logout. Per node, bounded.
type revocations struct {
	mu  sync.Mutex
	ids map[[16]byte]time.Time
}

func (r *revocations) revoke(s session, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[[16]byte]time.Time{}
	}
	for id, exp := range r.ids {
		if !now.Before(exp) {
			delete(r.ids, id)
		}
	}
	if len(r.ids) >= maxRevoked {
		return // full of live revocations: the cookies still expire
	}
	r.ids[s.id] = s.expires
}

func (r *revocations) revoked(id [16]byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[id]
	return ok
}

// setCookie writes a console cookie: HttpOnly, SameSite=Strict, scoped to
// the console, Secure unless the server is served over plain http.
func (c *Console) setCookie(w http.ResponseWriter, name, value string, expires time.Time) {
	ck := &http.Cookie{
		Name: name, Value: value, Path: strings.TrimSuffix(Prefix, "/"),
		HttpOnly: true, Secure: c.cfg.Secure, SameSite: http.SameSiteStrictMode,
	}
	if value == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = expires
	}
	http.SetCookie(w, ck)
}

// sessionOf returns the request's valid session.
func (c *Console) sessionOf(r *http.Request) (session, error) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, errBadCookie
	}
	s, err := c.keys.decode(ck.Value, c.cfg.Now())
	if err != nil || c.revoked.revoked(s.id) {
		return session{}, errBadCookie
	}
	return s, nil
}
