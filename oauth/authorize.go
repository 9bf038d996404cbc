package oauth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Sign-in form limits.
const (
	maxIdentifierLen = 512
	maxPasswordLen   = 1024
	// maxCodeLen bounds the mailed sign-in code (11 characters, with room
	// for what a paste brings along).
	maxCodeLen = 64
)

// pageError is a problem shown to a person as a page.
type pageError struct {
	status         int
	title, message string
	cause          error
	// retryAfter, when set, is sent as Retry-After (a busy server).
	retryAfter time.Duration
}

func (s *Server) showPageError(w http.ResponseWriter, e *pageError) {
	if e.status >= 500 && e.retryAfter == 0 {
		s.log.Error("authorization page failed", "err", e.cause)
	}
	if e.retryAfter > 0 {
		w.Header().Set(ratelimit.HeaderRetryAfter, strconv.FormatInt(ratelimit.RetryAfterSeconds(e.retryAfter), 10))
	}
	s.errorPage(w, e.status, e.title, e.message)
}

// busyPageError is the page for a step the server is too busy to take
// now.
func busyPageError(retry time.Duration) *pageError {
	return &pageError{status: http.StatusServiceUnavailable, title: "The server is busy",
		message: "It cannot finish this step right now. Try again in a few seconds.", retryAfter: retry}
}

func internalPageError(err error) *pageError {
	return &pageError{status: http.StatusInternalServerError, title: "Something went wrong on our side",
		message: "The server could not finish this step. Try again in a moment.", cause: err}
}

// readPagePost reads a form posted from one of our pages and checks its
// CSRF token. When either fails it shows the error page (expired for a
// missing or forged token) and ok is false.
func (s *Server) readPagePost(w http.ResponseWriter, r *http.Request, expired *pageError) (d *device, ok bool) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.showPageError(w, &pageError{status: http.StatusBadRequest, title: "This form could not be read", message: "Go back and try again."})
		return nil, false
	}
	d, ok = s.checkCSRF(r)
	if !ok {
		s.showPageError(w, expired)
		return nil, false
	}
	return d, true
}

var errRequestGone = &pageError{status: http.StatusBadRequest, title: "This sign-in link can't be used",
	message: "It has expired, was already used, or was opened in another browser. Go back to the app and start signing in again."}

// openRequest loads the authorization request a page is about and its
// client.
func (s *Server) openRequest(ctx context.Context, requestURI, clientID string) (*authRequest, *client, *pageError) {
	id, ok := strings.CutPrefix(requestURI, requestURIPrefix)
	if !ok || !opaqueID(id) || clientID == "" || !printable(clientID) {
		return nil, nil, &pageError{status: http.StatusBadRequest, title: "This sign-in link is incomplete",
			message: "The app sent you here without the details this server needs. Go back to the app and try again."}
	}
	req, err := getRequest(ctx, s.db, id)
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil, errRequestGone
	}
	if err != nil {
		return nil, nil, internalPageError(err)
	}
	if req.ClientID != clientID || req.Approved {
		return nil, nil, errRequestGone
	}
	c, err := s.clients.get(ctx, clientID)
	if err != nil {
		if errIsClient(err) {
			return nil, nil, &pageError{status: http.StatusBadRequest, title: "This app could not be verified",
				message: "The server could not load the app's published details, so it cannot continue. Try again later.", cause: err}
		}
		return nil, nil, internalPageError(err)
	}
	return req, c, nil
}

// flow is one step of an authorization in a browser.
type flow struct {
	w   http.ResponseWriter
	r   *http.Request
	d   *device
	req *authRequest
	c   *client
	// shown is the digest of the permissions the consent page showed
	// (grantsDigest), or "" when none was shown.
	shown string
}

func (f *flow) data(s *Server, title string) *pageData {
	return &pageData{
		Title: title, CSRF: s.csrfToken(f.d),
		RequestURI: requestURIPrefix + f.req.ID, ClientID: f.c.ID, ClientName: s.clientName(f.c),
	}
}

// page renders a step of the flow; its forms may lead to the client's
// redirect URI (cancel, deny, approve), so the CSP allows that origin.
func (s *Server) page(f *flow, status int, name string, d *pageData) {
	s.render(f.w, status, name, d, redirectSource(f.req.Params.RedirectURI))
}

func (s *Server) handleAuthorizeGet(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	req, c, perr := s.openRequest(ctx, q.Get("request_uri"), q.Get("client_id"))
	if perr != nil {
		s.showPageError(w, perr)
		return
	}
	d := s.browserDevice(w, r)
	err := execOne(ctx, s.db, qBindRequest, req.ID, d.ID, s.cfg.Now().Add(InteractionTTL))
	if errors.Is(err, db.ErrNotFound) {
		s.showPageError(w, errRequestGone)
		return
	}
	if err != nil {
		s.showPageError(w, internalPageError(err))
		return
	}
	f := &flow{w: w, r: r, d: d, req: req, c: c}
	if req.Params.Prompt == "none" {
		s.silentAuthorize(f)
		return
	}
	s.nextStep(f)
}

// nextStep shows what the person must do next: sign in, choose among the
// accounts signed in on this browser, or approve.
func (s *Server) nextStep(f *flow) {
	accounts, err := s.signedIn(f.r.Context(), f.d)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	hint := f.req.Params.LoginHint
	var candidates []Account
	for _, a := range accounts {
		if matchesHint(a, hint) {
			candidates = append(candidates, a)
		}
	}
	switch {
	case len(candidates) == 0 || f.req.Params.Prompt == "login":
		s.signInPage(f, http.StatusOK, "")
	case len(candidates) > 1 || f.req.Params.Prompt == "select_account":
		d := f.data(s, "Choose an account")
		d.Accounts = candidates
		s.page(f, http.StatusOK, "choose", d)
	default:
		s.consentPage(f, candidates[0])
	}
}

func (s *Server) signInPage(f *flow, status int, msg string) {
	s.signInPageWith(f, &signInOutcome{status: status, msg: msg})
}

// signInPageWith shows the sign-in form again after an attempt: the
// identifier as entered, never the password, and the code field when the
// account needs its mailed code.
func (s *Server) signInPageWith(f *flow, o *signInOutcome) {
	d := f.data(s, "Sign in")
	d.Error, d.Notice, d.AskCode = o.msg, o.notice, o.askCode
	d.Identifier = strings.TrimPrefix(f.req.Params.LoginHint, "@")
	if id := f.r.PostFormValue("identifier"); id != "" && len(id) <= maxIdentifierLen {
		d.Identifier = id
	}
	s.page(f, o.status, "signin", d)
}

func (s *Server) consentPage(f *flow, a Account) {
	s.consentPageWith(f, a, "")
}

func (s *Server) consentPageWith(f *flow, a Account, notice string) {
	ctx := f.r.Context()
	sets, err := s.describeSets(ctx, f.req.Params.Scope)
	if err == nil {
		var tokenScope string
		tokenScope, err = s.tokenScope(ctx, f.req.Params.Scope)
		f.shown = grantsDigest(tokenScope)
	}
	if err != nil {
		s.flowError(f, err)
		return
	}
	d := f.data(s, "Allow access?")
	d.Account = a
	d.Permissions = DescribeScope(f.req.Params.Scope)
	d.Sets = sets
	d.Shown = f.shown
	d.Notice = notice
	d.Switch = f.req.Params.LoginHint == ""
	s.page(f, http.StatusOK, "consent", d)
}

// grantsDigest names what a consent page showed: the approval must be
// for the same permissions (a permission set may change meanwhile).
func grantsDigest(tokenScope string) string {
	sum := sha256.Sum256([]byte(tokenScope))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// flowError ends a step that failed on what the app asked for: an error
// the app should hear (a permission set that no longer resolves) goes
// back to it and the request ends; a busy server is a page asking to
// retry; anything else is our fault.
func (s *Server) flowError(f *flow, err error) {
	var oe *Error
	switch {
	case errors.As(err, &oe) && oe.Status == http.StatusServiceUnavailable:
		s.showPageError(f.w, busyPageError(oe.retryAfter))
	case errors.As(err, &oe) && oe.Status < 500:
		s.refuseToClient(f, oe.Code, oe.Description)
	default:
		s.showPageError(f.w, internalPageError(err))
	}
}

// refuseToClient ends the request and sends the browser back to the app
// with an error (RFC 6749 section 4.1.2.1).
func (s *Server) refuseToClient(f *flow, code, description string) {
	err := execOne(f.r.Context(), s.db, qDeleteRequest, f.req.ID, f.d.ID)
	if err != nil && !errors.Is(err, db.ErrNotFound) {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	s.redirectToClient(f, url.Values{"error": {code}, "error_description": {description}})
}

var errFormExpired = &pageError{status: http.StatusForbidden, title: "This form has expired",
	message: "For your safety the form could not be accepted (it may be old, or sent from another site). Go back to the app and start again."}

func (s *Server) handleAuthorizePost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d, ok := s.readPagePost(w, r, errFormExpired)
	if !ok {
		return
	}
	req, c, perr := s.openRequest(ctx, r.PostFormValue("request_uri"), r.PostFormValue("client_id"))
	if perr != nil {
		s.showPageError(w, perr)
		return
	}
	if !bytes.Equal(req.DeviceID, d.ID) {
		s.showPageError(w, errRequestGone)
		return
	}
	f := &flow{w: w, r: r, d: d, req: req, c: c}
	switch r.PostFormValue("action") {
	case "signin":
		s.postSignIn(f)
	case "select":
		s.postSelect(f)
	case "another":
		s.signInPage(f, http.StatusOK, "")
	case "approve":
		s.postApprove(f)
	case "deny":
		s.postDeny(f)
	default:
		s.showPageError(w, &pageError{status: http.StatusBadRequest, title: "This form could not be read", message: "Go back and try again."})
	}
}

// signInOutcome is a sign-in attempt that did not sign in, as the page
// shows it.
type signInOutcome struct {
	status int
	// msg is the error shown, notice a message that is not one.
	msg, notice string
	// askCode shows the field for the code mailed to the account.
	askCode bool
}

// login runs Accounts.Login with the form's identifier, password and
// sign-in code, and turns its refusals into words. Once the code field
// has been shown (step=code), every refusal shows it again.
func (s *Server) login(ctx context.Context, r *http.Request) (Account, *signInOutcome, error) {
	id, pw := strings.TrimSpace(r.PostFormValue("identifier")), r.PostFormValue("password")
	code := strings.TrimSpace(r.PostFormValue("code"))
	askCode := r.PostFormValue("step") == "code"
	refuse := func(status int, msg string) (Account, *signInOutcome, error) {
		return Account{}, &signInOutcome{status: status, msg: msg, askCode: askCode}, nil
	}
	if id == "" || pw == "" {
		return refuse(http.StatusBadRequest, "Enter your handle or email and your password.")
	}
	if len(id) > maxIdentifierLen || len(pw) > maxPasswordLen || len(code) > maxCodeLen {
		return refuse(http.StatusBadRequest, "That handle, password or code is too long.")
	}
	if !printable(id) || strings.ContainsRune(pw, 0) || !utf8.ValidString(pw) || !printable(code) {
		return refuse(http.StatusBadRequest, "That handle, password or code contains characters that are not allowed.")
	}
	a, err := s.accounts.Login(ctx, id, pw, code)
	switch {
	case err == nil:
		return a, nil, nil
	case errors.Is(err, ErrCodeRequired):
		return Account{}, &signInOutcome{status: http.StatusOK, askCode: true,
			notice: "This account also needs a sign-in code. One has been sent to its email address: enter it below, with your password again."}, nil
	case errors.Is(err, ErrCodeInvalid):
		askCode = true
		return refuse(http.StatusUnauthorized, "That sign-in code is wrong or was already used. Enter the code from the latest email, or leave the code empty to have a new one sent.")
	case errors.Is(err, ErrCodeExpired):
		askCode = true
		return refuse(http.StatusUnauthorized, "That sign-in code has expired. Leave the code empty and sign in again to have a new one sent.")
	case errors.Is(err, ErrLoginFailed):
		return refuse(http.StatusUnauthorized, "Wrong handle, email or password.")
	case errors.Is(err, ErrRateLimited):
		return refuse(http.StatusTooManyRequests, "Too many sign-in attempts. Wait a few minutes, then try again.")
	case errors.Is(err, ErrAccountUnavailable):
		return refuse(http.StatusForbidden, "This account cannot be used to sign in to apps.")
	case errors.Is(err, ErrBusy):
		return refuse(http.StatusServiceUnavailable, "The server is busy. Try again in a few seconds.")
	}
	return Account{}, nil, err
}

// loginBusyRetry is the Retry-After of a sign-in the server was too busy
// to check.
const loginBusyRetry = 2 * time.Second

// loginRefused sets the headers of a refused sign-in's page.
func loginRefused(w http.ResponseWriter, status int) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set(ratelimit.HeaderRetryAfter, strconv.FormatInt(ratelimit.RetryAfterSeconds(loginBusyRetry), 10))
	}
}

func (s *Server) postSignIn(f *flow) {
	ctx := f.r.Context()
	a, refused, err := s.login(ctx, f.r)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	if refused != nil {
		loginRefused(f.w, refused.status)
		s.signInPageWith(f, refused)
		return
	}
	if !matchesHint(a, f.req.Params.LoginHint) {
		s.signInPage(f, http.StatusForbidden, "The app asked you to sign in as "+f.req.Params.LoginHint+". Sign in with that account.")
		return
	}
	d, err := s.signInDevice(ctx, f.w, f.r, f.d, a.DID)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	f.d = d
	s.consentPage(f, a)
}

// chosenAccount is the signed-in account the form names, if it may be
// used for this request; otherwise it shows the page that says why, and ok
// is false.
func (s *Server) chosenAccount(f *flow) (a Account, ok bool) {
	accounts, err := s.signedIn(f.r.Context(), f.d)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return Account{}, false
	}
	a, ok = findAccount(accounts, f.r.PostFormValue("did"))
	if !ok || !matchesHint(a, f.req.Params.LoginHint) {
		s.signInPage(f, http.StatusUnauthorized, "That account is no longer signed in here. Sign in again.")
		return Account{}, false
	}
	return a, true
}

func (s *Server) postSelect(f *flow) {
	a, ok := s.chosenAccount(f)
	if !ok {
		return
	}
	s.consentPage(f, a)
}

func (s *Server) postApprove(f *flow) {
	a, ok := s.chosenAccount(f)
	if !ok {
		return
	}
	f.shown = f.r.PostFormValue("grants")
	s.approve(f, a, "authorization approved")
}

// approve issues the code for a, with the request's scope expanded as the
// consent page showed it (f.shown; a page whose permissions have changed
// since is shown again), and sends the browser back to the app.
func (s *Server) approve(f *flow, a Account, logMsg string) {
	ctx := f.r.Context()
	tokenScope, err := s.tokenScope(ctx, f.req.Params.Scope)
	if err != nil {
		s.flowError(f, err)
		return
	}
	if f.shown != "" && f.shown != grantsDigest(tokenScope) {
		s.consentPageWith(f, a, "What this app asks for has changed since the page was shown. Review it again.")
		return
	}
	code := "cod-" + randomToken(32)
	err = execOne(ctx, s.db, qApproveRequest, f.req.ID, f.d.ID, string(a.DID), hashSecret(code), s.cfg.Now().Add(CodeTTL), tokenScope)
	if errors.Is(err, db.ErrNotFound) {
		s.showPageError(f.w, errRequestGone)
		return
	}
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	s.log.Info(logMsg, "did", a.DID, "client", f.c.ID)
	s.redirectToClient(f, url.Values{"code": {code}})
}

func (s *Server) postDeny(f *flow) {
	err := execOne(f.r.Context(), s.db, qDeleteRequest, f.req.ID, f.d.ID)
	if errors.Is(err, db.ErrNotFound) {
		s.showPageError(f.w, errRequestGone)
		return
	}
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	s.redirectToClient(f, url.Values{"error": {CodeAccessDenied}, "error_description": {"The user did not allow access"}})
}

// redirectToClient sends the browser back to the client with the result,
// the state and our issuer (RFC 9207), in the query or the fragment.
func (s *Server) redirectToClient(f *flow, vals url.Values) {
	vals.Set("state", f.req.Params.State)
	vals.Set("iss", s.cfg.Issuer)
	u, err := url.Parse(f.req.Params.RedirectURI)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	var target string
	if f.req.Params.ResponseMode == "fragment" {
		u.Fragment = ""
		target = u.String() + "#" + vals.Encode()
	} else {
		q := u.Query()
		for k, v := range vals {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		target = u.String()
	}
	h := f.w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Location", target)
	f.w.WriteHeader(http.StatusSeeOther)
}
