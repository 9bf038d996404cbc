package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/internal/keyring"
)

// Cookie names. Both are scoped to Prefix.
const (
	sessionCookie = "bulwark_console"
	loginCookie   = "bulwark_console_login"
)

// csrfField is the name of the hidden field every form carries.
const csrfField = "csrf"

// errBadCookie means a cookie is missing, malformed, expired, logged out,
// not signed by this server, or signed for another purpose.
var errBadCookie = errors.New("no valid console session")

//go:embed sessions.sql
var sessionsSQL string

var (
	sessionQueries = db.MustParseQueries(sessionsSQL)
	qInsertSession = sessionQueries.MustGet("InsertSession")
	qSessionLive   = sessionQueries.MustGet("SessionLive")
	qDeleteSession = sessionQueries.MustGet("DeleteSession")
	qDeleteExpired = sessionQueries.MustGet("DeleteExpiredSessions")
)

// session is a logged-in operator's session, or a login attempt: a random
// id and its lifetime.
type session struct {
	id      [16]byte
	expires time.Time
}

// Every value the console signs names its purpose (package keyring): a
// login attempt's cookie, a session's cookie, and the CSRF tokens of the
// login form and of a session's forms are four purposes, and no value of
// one is accepted as another.

// seal signs s as a cookie value for purpose p.
func (c *Console) seal(p keyring.Purpose, s session) string {
	return c.keys.Seal(p, s.id[:], s.expires)
}

// open reads a cookie value signed for purpose p.
func (c *Console) open(p keyring.Purpose, v string) (session, error) {
	payload, expires, err := c.keys.Open(p, v, c.cfg.Now())
	if err != nil || len(payload) != 16 {
		return session{}, errBadCookie
	}
	s := session{expires: expires}
	copy(s.id[:], payload)
	return s, nil
}

// csrfToken is the CSRF token for forms of the session (ConsoleSessionCSRF)
// or login attempt (ConsoleLoginCSRF) s: only pages this server rendered
// for s carry it.
func (c *Console) csrfToken(p keyring.Purpose, s session) string {
	return c.keys.Tag(p, s.id[:])
}

// checkCSRF compares a submitted token with s's in constant time.
func (c *Console) checkCSRF(p keyring.Purpose, s session, got string) bool {
	return c.keys.CheckTag(p, got, s.id[:])
}

func newID() [16]byte {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		panic(err)
	}
	return id
}

// rowID is the key of s's row: the id never reaches the database as is.
func rowID(s session) []byte {
	sum := sha256.Sum256(s.id[:])
	return sum[:]
}

// startSession records a new session (after the password was checked),
// dropping expired ones, and returns it.
func (c *Console) startSession(ctx context.Context) (session, error) {
	now := c.cfg.Now()
	s := session{id: newID(), expires: now.Add(c.cfg.SessionTTL)}
	if _, err := c.cfg.DB.Exec(ctx, qDeleteExpired, now); err != nil {
		return session{}, fmt.Errorf("console sessions: %w", db.Translate(err))
	}
	if _, err := c.cfg.DB.Exec(ctx, qInsertSession, rowID(s), s.expires); err != nil {
		return session{}, fmt.Errorf("console sessions: %w", db.Translate(err))
	}
	return s, nil
}

// endSession forgets s: its cookie opens nothing any more, on any node.
func (c *Console) endSession(ctx context.Context, s session) error {
	if _, err := c.cfg.DB.Exec(ctx, qDeleteSession, rowID(s)); err != nil {
		return fmt.Errorf("console sessions: %w", db.Translate(err))
	}
	return nil
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

// sessionOf returns the request's live session: errBadCookie when there is
// none, another error when the database cannot say.
func (c *Console) sessionOf(r *http.Request) (session, error) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, errBadCookie
	}
	s, err := c.open(keyring.ConsoleSession, ck.Value)
	if err != nil {
		return session{}, err
	}
	var live bool
	if err := c.cfg.DB.QueryRow(r.Context(), qSessionLive, rowID(s), c.cfg.Now()).Scan(&live); err != nil {
		return session{}, fmt.Errorf("console sessions: %w", db.Translate(err))
	}
	if !live {
		return session{}, errBadCookie
	}
	return s, nil
}
