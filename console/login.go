package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/internal/keyring"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// loginAttemptTTL is how long a login form may be filled in.
const loginAttemptTTL = 15 * time.Minute

// loginView is the login form.
type loginView struct {
	Next    string
	CSRF    string
	Message string
	// PasswordFile is where the password is kept ("" when it is set by
	// BULWARK_ADMIN_PASSWORD).
	PasswordFile string
}

// loginAttempt starts (or continues) a login: a short-lived signed cookie
// whose id the form's CSRF token is bound to.
func (c *Console) loginAttempt(w http.ResponseWriter, r *http.Request) session {
	if ck, err := r.Cookie(loginCookie); err == nil {
		if s, err := c.open(keyring.ConsoleLogin, ck.Value); err == nil {
			return s
		}
	}
	s := session{id: newID(), expires: c.cfg.Now().Add(loginAttemptTTL)}
	c.setCookie(w, loginCookie, c.seal(keyring.ConsoleLogin, s), s.expires)
	return s
}

func (c *Console) handleLoginForm(w http.ResponseWriter, r *http.Request) {
	c.showLogin(w, r, http.StatusOK, "")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	a := c.loginAttempt(w, r)
	c.render(w, status, "login", view{Title: "Log in", Data: loginView{
		Next: safeNext(r.FormValue("next")), CSRF: c.csrfToken(keyring.ConsoleLoginCSRF, a), Message: msg,
		PasswordFile: c.cfg.AdminPasswordFile,
	}})
}

// handleLogin checks the admin password. Every attempt spends a point of
// the client address's consoleLogin limit first, as createSession does, so
// that guessing costs the guesser and not the server.
func (c *Console) handleLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	if !sameOrigin(r) {
		c.fail(w, r, http.StatusForbidden, "The form was not sent from this console.")
		return
	}
	now := c.cfg.Now()
	if d := c.cfg.LoginLimiter.AllowN(ratelimit.IPKey(c.cfg.ClientIP(r)), 1); !d.Allowed {
		ratelimit.SetHeaders(w.Header(), d, now)
		w.Header().Set(ratelimit.HeaderRetryAfter, strconv.FormatInt(ratelimit.RetryAfterSeconds(d.RetryAfter), 10))
		c.showLogin(w, r, http.StatusTooManyRequests, "Too many login attempts from your address; try again in "+d.RetryAfter.Round(time.Second).String()+".")
		return
	}
	ck, err := r.Cookie(loginCookie)
	var a session
	if err == nil {
		a, err = c.open(keyring.ConsoleLogin, ck.Value)
	}
	if err != nil || !c.checkCSRF(keyring.ConsoleLoginCSRF, a, r.PostForm.Get(csrfField)) {
		c.showLogin(w, r, http.StatusForbidden, "The login form expired; try again.")
		return
	}
	got, want := sha256.Sum256([]byte(r.PostForm.Get("password"))), sha256.Sum256([]byte(c.cfg.AdminPassword))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		c.log.Warn("console login failed", "client", c.cfg.ClientIP(r).String())
		c.showLogin(w, r, http.StatusUnauthorized, "Wrong password.")
		return
	}
	s, err := c.startSession(r.Context())
	if err != nil {
		c.log.Error("console login failed", "err", err)
		c.fail(w, r, http.StatusInternalServerError, "Something went wrong; the server log has the details.")
		return
	}
	c.setCookie(w, sessionCookie, c.seal(keyring.ConsoleSession, s), s.expires)
	c.setCookie(w, loginCookie, "", time.Time{})
	c.log.Info("console login", "client", c.cfg.ClientIP(r).String())
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (c *Console) handleLogout(w http.ResponseWriter, r *http.Request, s session) error {
	if err := c.endSession(r.Context(), s); err != nil {
		return err
	}
	c.setCookie(w, sessionCookie, "", time.Time{})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
	return nil
}

// maxNext bounds a post-login destination.
const maxNext = 2048

// safeNext keeps a post-login destination inside the console: a path
// (no scheme, host or user), which once cleaned of dot segments and
// repeated slashes is still under Prefix; anything else is Prefix.
func safeNext(next string) string {
	if len(next) > maxNext || strings.ContainsAny(next, "\\\r\n\t") {
		return Prefix
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return Prefix
	}
	clean := path.Clean(u.Path)
	if !strings.HasPrefix(clean+"/", Prefix) {
		return Prefix
	}
	if strings.HasSuffix(u.Path, "/") && !strings.HasSuffix(clean, "/") {
		clean += "/"
	}
	return (&url.URL{Path: clean, RawQuery: u.RawQuery}).String()
}
