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
	"github.com/jackc/pgx/v5"

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
	minCookieValue = 32
	maxCookieValue = 128
)

// device is a browser that opened the sign-in pages: the random secret
// its cookie holds, and that secret's hash, which binds authorization
// requests to the browser. Nothing is stored for a browser until someone
// signs in on it (signInDevice): opening pages, anonymously and as often
// as anyone likes, leaves no row behind.
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

// cookieDevice returns the browser the request's cookie names, or nil.
// Nothing is looked up: whether anyone is signed in on it is
// oauth_device_accounts' to say.
func (s *Server) cookieDevice(r *http.Request) *device {
	ck, err := r.Cookie(s.cookieName(deviceCookie))
	if err != nil || len(ck.Value) < minCookieValue || len(ck.Value) > maxCookieValue || !opaqueID(ck.Value) {
		return nil
	}
	return &device{ID: hashSecret(ck.Value), secret: ck.Value}
}

// browserDevice returns the request's browser, giving it a cookie when it
// has none. Nothing is stored.
func (s *Server) browserDevice(w http.ResponseWriter, r *http.Request) *device {
	if d := s.cookieDevice(r); d != nil {
		return d
	}
	d := newDevice()
	s.setDeviceCookie(w, d)
	return d
}

func newDevice() *device {
	secret := randomToken(32)
	return &device{ID: hashSecret(secret), secret: secret}
}

func (s *Server) setDeviceCookie(w http.ResponseWriter, d *device) {
	http.SetCookie(w, &http.Cookie{
		Name:     s.cookieName(deviceCookie),
		Value:    d.secret,
		Path:     "/",
		MaxAge:   int(s.cfg.SignInTTL.Seconds()),
		HttpOnly: true,
		Secure:   s.secure,
		SameSite: http.SameSiteLaxMode,
	})
}

// csrfPurpose separates the form tokens from anything else that might
// one day be derived from the cookie with the same key.
const csrfPurpose = "bulwark oauth form\x00"

// csrfToken is the token forms of this browser must carry: an HMAC of the
// device cookie, so a page on another origin can neither read nor forge
// it, and no state is kept for it, before or after sign-in.
func (s *Server) csrfToken(d *device) string {
	mac := hmac.New(sha256.New, s.csrfKey)
	mac.Write([]byte(csrfPurpose))
	mac.Write([]byte(d.secret))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// checkCSRF verifies a POST from one of our pages: the device cookie,
// the token derived from it, and (when the browser says) a same-origin
// request.
func (s *Server) checkCSRF(r *http.Request) (*device, bool) {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return nil, false
	}
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" && origin != s.cfg.Issuer {
		return nil, false
	}
	d := s.cookieDevice(r)
	if d == nil {
		return nil, false
	}
	got := r.PostFormValue(csrfField)
	if got == "" || !hmac.Equal([]byte(got), []byte(s.csrfToken(d))) {
		return nil, false
	}
	return d, true
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

// signInDevice remembers that did signed in on the browser of old: the
// first state kept for a browser. The browser gets a fresh cookie (so a
// cookie planted before the sign-in is worth nothing after it), under
// which the accounts already signed in on it and the requests it has open
// carry on. It returns the browser under its new cookie.
func (s *Server) signInDevice(ctx context.Context, w http.ResponseWriter, r *http.Request, old *device, did syntax.DID) (*device, error) {
	d := newDevice()
	ua := r.UserAgent()
	if len(ua) > maxUserAgent {
		ua = ua[:maxUserAgent]
	}
	ua = strings.ToValidUTF8(strings.ReplaceAll(ua, "\x00", ""), "")
	expires := s.cfg.Now().Add(s.cfg.SignInTTL)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qInsertDevice, d.ID, ua, expires); err != nil {
			return err
		}
		for _, q := range []string{qMoveDeviceAccounts, qMoveDeviceRequests} {
			if _, err := tx.Exec(ctx, q, old.ID, d.ID); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, qDeleteDevice, old.ID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qUpsertDeviceAccount, d.ID, string(did), expires); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, qTrimAccountDevices, string(did), maxDevicesPerAccount)
		return err
	})
	if err != nil {
		return nil, db.Translate(err)
	}
	s.setDeviceCookie(w, d)
	return d, nil
}

// signOutDevice forgets did on d, and d itself once no one is signed in
// on it.
func (s *Server) signOutDevice(ctx context.Context, d *device, did syntax.DID) error {
	if _, err := s.db.Exec(ctx, qDeleteDeviceAccount, d.ID, string(did)); err != nil {
		return db.Translate(err)
	}
	_, err := s.db.Exec(ctx, qDeleteDeviceIfUnused, d.ID)
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
