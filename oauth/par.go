package oauth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/oauth/dpop"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Request limits.
const (
	// MaxFormBytes bounds a PAR, token or revocation request body.
	MaxFormBytes = 64 << 10
	maxStateLen  = 1024
	maxHintLen   = 512
	// requestURIPrefix is the request_uri form (RFC 9126).
	requestURIPrefix = "urn:ietf:params:oauth:request_uri:"
	// challengeReuseWindow: PKCE challenges may not be reused within a
	// day, as the profile asks.
	challengeReuseWindow = 24 * time.Hour
)

// randomToken returns n random bytes, base64url.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// readForm parses a form-encoded POST body of bounded size and refuses
// repeated parameters (RFC 6749 section 3.1).
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(strings.ToLower(ct), "application/x-www-form-urlencoded") {
		return nil, invalidRequest("body must be application/x-www-form-urlencoded")
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxFormBytes)
	if err := r.ParseForm(); err != nil {
		return nil, invalidRequest("malformed or oversized form body")
	}
	for k, v := range r.PostForm {
		if len(v) > 1 {
			return nil, invalidRequest("parameter %q appears more than once", k)
		}
		if !printable(v[0]) {
			return nil, invalidRequest("parameter %q holds control characters or invalid UTF-8", k)
		}
	}
	return r.PostForm, nil
}

// printable reports whether s is valid UTF-8 without control characters:
// every parameter may end up stored, shown or echoed back.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// opaqueID reports whether s looks like an id this server made (random
// base64url with a short prefix), before it goes near a query.
func opaqueID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// verifyDPoP checks the DPoP proof of a request to one of our endpoints.
func (s *Server) verifyDPoP(r *http.Request, path, accessToken string) (*dpop.Proof, error) {
	if len(r.Header.Values("DPoP")) > 1 {
		return nil, dpopError(errors.New("more than one DPoP header"))
	}
	p, err := s.dpop.Verify(r.Header.Get("DPoP"), dpop.Request{Method: r.Method, URL: s.endpoint(path), AccessToken: accessToken})
	if err != nil {
		return nil, dpopError(err)
	}
	return p, nil
}

type parResponse struct {
	RequestURI string `json:"request_uri"`
	ExpiresIn  int    `json:"expires_in"`
}

func (s *Server) handlePAR(w http.ResponseWriter, r *http.Request) {
	res, err := s.pushRequest(r.Context(), w, r)
	s.answer(w, r, http.StatusCreated, res, err)
}

// readClientPost reads a client's form post to path (the PAR or the token
// endpoint, which both require a DPoP proof and a client_id) and spends a
// point of the client's policy, before anything is fetched for it.
func (s *Server) readClientPost(w http.ResponseWriter, r *http.Request, path, policy string) (form url.Values, clientID string, proof *dpop.Proof, err error) {
	form, err = readForm(w, r)
	if err != nil {
		return nil, "", nil, err
	}
	proof, err = s.verifyDPoP(r, path, "")
	if err != nil {
		return nil, "", nil, err
	}
	clientID, err = s.formClientID(w, form, policy)
	if err != nil {
		return nil, "", nil, err
	}
	return form, clientID, proof, nil
}

// formClientID is the form's client_id, after a point of the client's
// policy is spent.
func (s *Server) formClientID(w http.ResponseWriter, form url.Values, policy string) (string, error) {
	clientID := form.Get("client_id")
	switch {
	case clientID == "":
		return "", invalidRequest("client_id is required")
	case len(clientID) > MaxClientIDLen:
		return "", invalidClient("client_id is longer than %d bytes", MaxClientIDLen)
	}
	return clientID, s.perClient(w, policy, clientID)
}

func (s *Server) pushRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) (*parResponse, error) {
	form, clientID, proof, err := s.readClientPost(w, r, PathPAR, ratelimit.PolicyOAuthClientPAR)
	if err != nil {
		return nil, err
	}
	c, err := s.clients.get(ctx, clientID)
	if err != nil {
		return nil, err
	}
	auth, err := s.authenticateClient(ctx, c, form)
	if err != nil {
		return nil, err
	}
	params, err := checkAuthorizationParams(c, form, s.sets != nil)
	if err != nil {
		return nil, err
	}
	if jkt := form.Get("dpop_jkt"); jkt != "" && jkt != proof.JKT {
		return nil, invalidRequest("dpop_jkt does not match the DPoP proof's key")
	}
	// Every permission set must resolve, and all of them expanded stay
	// within bounds, before the request is kept (the permission spec: a
	// set that cannot be resolved fails the request).
	if _, err := s.tokenScope(ctx, params.Scope); err != nil {
		return nil, err
	}
	req := &authRequest{
		ID:         "req-" + randomToken(32),
		ClientID:   c.ID,
		Params:     *params,
		JKT:        proof.JKT,
		ClientAuth: auth,
		ExpiresAt:  s.cfg.Now().Add(RequestTTL),
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.checkPending(ctx, tx, c.ID); err != nil {
			return err
		}
		reuse := s.cfg.Now().Add(challengeReuseWindow)
		if err := useValue(ctx, tx, "pkce", params.CodeChallenge, reuse); err != nil {
			if errors.Is(err, errReused) {
				return invalidRequest("code_challenge was already used; make a new one for every request")
			}
			return err
		}
		if err := useValue(ctx, tx, "state", c.ID+"\x00"+params.State, reuse); err != nil {
			if errors.Is(err, errReused) {
				return invalidRequest("state was already used; make a new one for every request")
			}
			return err
		}
		return insertRequest(ctx, tx, req)
	})
	if err != nil {
		return nil, asError(db.Translate(err))
	}
	s.recordedValues(ctx, 2)
	return &parResponse{RequestURI: requestURIPrefix + req.ID, ExpiresIn: int(RequestTTL / time.Second)}, nil
}

// checkAuthorizationParams validates the authorization request parameters
// against the client.
func checkAuthorizationParams(c *client, form url.Values, sets bool) (*requestParams, error) {
	if form.Get("request") != "" {
		return nil, oauthErr(http.StatusBadRequest, CodeRequestNotSupp, "request objects are not supported")
	}
	if form.Get("request_uri") != "" {
		return nil, invalidRequest("request_uri must not be pushed")
	}
	if rt := form.Get("response_type"); rt != "code" {
		return nil, oauthErr(http.StatusBadRequest, CodeUnsupportedResp, "response_type must be code")
	}
	p := &requestParams{
		RedirectURI:   form.Get("redirect_uri"),
		State:         form.Get("state"),
		CodeChallenge: form.Get("code_challenge"),
		ResponseMode:  form.Get("response_mode"),
		LoginHint:     form.Get("login_hint"),
		Prompt:        form.Get("prompt"),
	}
	if p.CodeChallenge == "" {
		return nil, invalidRequest("code_challenge is required (PKCE)")
	}
	switch form.Get("code_challenge_method") {
	case "S256":
	case "":
		return nil, invalidRequest("code_challenge_method is required and must be S256")
	default:
		return nil, invalidRequest("code_challenge_method must be S256")
	}
	if b, err := base64.RawURLEncoding.DecodeString(p.CodeChallenge); err != nil || len(b) != 32 {
		return nil, invalidRequest("code_challenge must be a base64url SHA-256 hash")
	}
	if p.State == "" || len(p.State) > maxStateLen {
		return nil, invalidRequest("state is required (at most %d bytes)", maxStateLen)
	}
	if p.RedirectURI == "" {
		return nil, invalidRequest("redirect_uri is required")
	}
	if !redirectAllowed(c, p.RedirectURI) {
		return nil, invalidRequest("redirect_uri is not one of the client's registered redirect_uris")
	}
	switch p.ResponseMode {
	case "":
		p.ResponseMode = "query"
	case "query", "fragment":
	default:
		return nil, invalidRequest("response_mode must be query or fragment")
	}
	if len(p.LoginHint) > maxHintLen {
		return nil, invalidRequest("login_hint is too long")
	}
	switch p.Prompt {
	case "", "login", "consent", "select_account", "none":
	case "create":
		return nil, invalidRequest("account creation is not offered during authorization")
	default:
		return nil, invalidRequest("unsupported prompt value")
	}
	scope, err := grantableScope(form.Get("scope"), c.Metadata.Scope, sets)
	if err != nil {
		return nil, oauthErr(http.StatusBadRequest, CodeInvalidScope, "%s", strings.TrimPrefix(err.Error(), ErrInvalidScope.Error()+": "))
	}
	p.Scope = scope
	return p, nil
}
