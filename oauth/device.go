package oauth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

// Cookie base names; on an https issuer they get the __Host- prefix, which
// makes browsers refuse them from subdomains (handles live there) and
// without Secure.
const (
	deviceCookie = "bulwark-device"
	// csrfField is the hidden form field carrying the CSRF token.
	csrfField      = "csrf_token"
	maxUserAgent   = 256
	maxCookieValue = 128
)

// device is a browser known to the sign-in pages.
type device struct {
	ID []byte
	// secret is the cookie value; CSRF tokens are derived from it.
	secret string
}

func (s *Server) cookieName(base string) string {
	if s.secure {
		return "__Host-" + base
	}
	return base
}

// existingDevice returns the browser's device session, or nil.
func (s *Server) existingDevice(ctx context.Context, r *http.Request) (*device, error) {
	ck, err := r.Cookie(s.cookieName(deviceCookie))
	if err != nil || ck.Value == "" || len(ck.Value) > maxCookieValue {
		return nil, nil
	}
	id := hashSecret(ck.Value)
	err = execOne(ctx, s.db, qTouchDevice, id, s.cfg.Now().Add(DefaultDeviceTTL))
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &device{ID: id, secret: ck.Value}, nil
}

// ensureDevice returns the browser's device session, starting one (and
// setting its cookie) if it has none.
func (s *Server) ensureDevice(ctx context.Context, w http.ResponseWriter, r *http.Request) (*device, error) {
	d, err := s.existingDevice(ctx, r)
	if err != nil || d != nil {
		return d, err
	}
	secret := randomToken(32)
	ua := r.UserAgent()
	if len(ua) > maxUserAgent {
		ua = ua[:maxUserAgent]
	}
	ua = strings.ToValidUTF8(strings.ReplaceAll(ua, "\x00", ""), "")
	d = &device{ID: hashSecret(secret), secret: secret}
	if _, err := s.db.Exec(ctx, qInsertDevice, d.ID, ua, s.cfg.Now().Add(DefaultDeviceTTL)); err != nil {
		return nil, db.Translate(err)
	}
	http.SetCookie(w, &http.Cookie{
		Name:     s.cookieName(deviceCookie),
		Value:    secret,
		Path:     "/",
		MaxAge:   int(DefaultDeviceTTL.Seconds()),
		HttpOnly: true,
		Secure:   s.secure,
		SameSite: http.SameSiteLaxMode,
	})
	return d, nil
}

// csrfToken is the token forms of this device must carry: an HMAC of the
// device cookie, so a page on another origin can neither read nor forge
// it, and no state is kept for it.
func (s *Server) csrfToken(d *device) string {
	mac := hmac.New(sha256.New, s.csrfKey)
	mac.Write([]byte(d.secret))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// checkCSRF verifies a POST from one of our pages: the device cookie,
// the token derived from it, and (when the browser says) a same-origin
// request.
func (s *Server) checkCSRF(ctx context.Context, r *http.Request) (*device, bool, error) {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return nil, false, nil
	}
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" && origin != s.cfg.Issuer {
		return nil, false, nil
	}
	d, err := s.existingDevice(ctx, r)
	if err != nil || d == nil {
		return nil, false, err
	}
	got := r.PostFormValue(csrfField)
	if got == "" || !hmac.Equal([]byte(got), []byte(s.csrfToken(d))) {
		return nil, false, nil
	}
	return d, true, nil
}

// signedIn returns the accounts signed in on d that may still use OAuth.
func (s *Server) signedIn(ctx context.Context, d *device) ([]Account, error) {
	dids, err := deviceAccounts(ctx, s.db, d.ID)
	if err != nil {
		return nil, err
	}
	var out []Account
	for _, did := range dids {
		a, err := s.accounts.Get(ctx, did)
		if errors.Is(err, ErrAccountUnavailable) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// signInDevice remembers that acct signed in on d.
func (s *Server) signInDevice(ctx context.Context, d *device, did syntax.DID) error {
	_, err := s.db.Exec(ctx, qUpsertDeviceAccount, d.ID, string(did), s.cfg.Now().Add(s.cfg.SignInTTL))
	return db.Translate(err)
}

// signOutDevice forgets acct on d.
func (s *Server) signOutDevice(ctx context.Context, d *device, did syntax.DID) error {
	_, err := s.db.Exec(ctx, qDeleteDeviceAccount, d.ID, string(did))
	return db.Translate(err)
}

// findAccount picks did out of accounts.
func findAccount(accounts []Account, did string) (Account, bool) {
	for _, a := range accounts {
		if string(a.DID) == did {
			return a, true
		}
	}
	return Account{}, false
}

// matchesHint reports whether a is the account a login_hint names (a
// handle or a DID; empty matches anything).
func matchesHint(a Account, hint string) bool {
	if hint == "" {
		return true
	}
	hint = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(hint)), "@")
	return hint == strings.ToLower(string(a.DID)) || (a.Handle != "" && hint == strings.ToLower(a.Handle))
}
