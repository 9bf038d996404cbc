package pds

import (
	"net/http"
	"strings"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/oauth"
)

// registerSessionRoutes registers the com.atproto.server session methods.
func (s *Server) registerSessionRoutes() {
	if s.accounts == nil {
		return
	}
	s.procedure("com.atproto.server.createSession", s.handleCreateSession, hashesPassword())
	s.query("com.atproto.server.getSession", s.handleGetSession)
	s.procedure("com.atproto.server.refreshSession", s.handleRefreshSession)
	s.procedure("com.atproto.server.deleteSession", s.handleDeleteSession)
}

// sessionOutput is the shape createSession, refreshSession and getSession
// share (fields each lexicon marks optional are omitted when empty). The
// email fields are shown to sessions of the account password and of
// privileged app passwords only.
type sessionOutput struct {
	AccessJwt       string       `json:"accessJwt,omitempty"`
	RefreshJwt      string       `json:"refreshJwt,omitempty"`
	Handle          string       `json:"handle"`
	DID             string       `json:"did"`
	DIDDoc          *didDocument `json:"didDoc,omitempty"`
	Email           string       `json:"email,omitempty"`
	EmailConfirmed  *bool        `json:"emailConfirmed,omitempty"`
	EmailAuthFactor *bool        `json:"emailAuthFactor,omitempty"`
	Active          bool         `json:"active"`
	Status          string       `json:"status,omitempty"`
}

func (s *Server) sessionOutput(r *http.Request, a *account.Account, sess *account.Session, withEmail bool) (*sessionOutput, error) {
	doc, err := s.didDoc(r.Context(), a)
	if err != nil {
		return nil, err
	}
	out := &sessionOutput{Handle: a.Handle.String(), DID: a.DID.String(), DIDDoc: doc, Active: a.Active()}
	if !a.Active() {
		out.Status = string(a.Status)
	}
	if sess != nil {
		out.AccessJwt, out.RefreshJwt = sess.AccessJwt, sess.RefreshJwt
	}
	if withEmail && a.Email != "" {
		confirmed, authFactor := a.EmailConfirmedAt != nil, a.EmailAuthFactor
		out.Email, out.EmailConfirmed, out.EmailAuthFactor = a.Email, &confirmed, &authFactor
	}
	return out, nil
}

type createSessionInput struct {
	Identifier      string `json:"identifier"`
	Password        string `json:"password"`
	AuthFactorToken string `json:"authFactorToken"`
	AllowTakendown  bool   `json:"allowTakendown"`
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) error {
	var in createSessionInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if strings.TrimSpace(in.Identifier) == "" || in.Password == "" {
		return InvalidRequest("identifier and password are required")
	}
	a, app, err := s.loginWith(w, r, in.Identifier, in.Password, loginOptions{allowTakendown: in.AllowTakendown, factorToken: in.AuthFactorToken})
	if err != nil {
		return err
	}
	var sess *account.Session
	if a.Status == account.StatusTakendown {
		// Only to move away: export the repository, sign the PLC
		// operation, get a service token for the new server's
		// createAccount (requireAuth's allowTakendown).
		sess, err = s.accounts.CreateTakendownSession(r.Context(), a.DID)
	} else {
		sess, err = s.accounts.CreateSession(r.Context(), a.DID, app)
	}
	if err != nil {
		return err
	}
	out, err := s.sessionOutput(r, a, sess, app == nil || app.Privileged)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetSession(w http.ResponseWriter, r *http.Request) error {
	// Any OAuth grant may learn whose account it is; the email address
	// needs account:email (or transition:email).
	auth, err := s.requireAuth(r, allowDeactivated(), oauthAnyGrant())
	if err != nil {
		return err
	}
	a, err := s.accounts.Get(r.Context(), auth.DID)
	if err != nil {
		return err
	}
	withEmail := auth.Privileged()
	if auth.OAuth != nil {
		withEmail = auth.OAuth.CanAccount("email", oauth.ActionRead)
	}
	out, err := s.sessionOutput(r, a, nil, withEmail)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleRefreshSession(w http.ResponseWriter, r *http.Request) error {
	token, err := refreshToken(r)
	if err != nil {
		return err
	}
	a, sess, err := s.accounts.Refresh(r.Context(), token)
	if err != nil {
		return err
	}
	// The new access token says what kind of session this is.
	withEmail := false
	if au, err := s.accounts.ParseAccess(sess.AccessJwt); err == nil {
		withEmail = au.Privileged()
	}
	out, err := s.sessionOutput(r, a, sess, withEmail)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) error {
	token, err := refreshToken(r)
	if err != nil {
		return err
	}
	if err := s.accounts.Logout(r.Context(), token); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
