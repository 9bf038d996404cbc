package oauth

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

const accountTitle = "Connected apps"

var errAccountFormExpired = &pageError{status: http.StatusForbidden, title: "This form has expired",
	message: "For your safety the form could not be accepted. Open the connected apps page again."}

// handleAccountGet shows the apps that can use a signed-in account, with a
// button to take each one's access back.
func (s *Server) handleAccountGet(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := s.browserDevice(w, r)
	data := &pageData{Title: accountTitle, CSRF: s.csrfToken(d), FormAction: PathAccount}
	accounts, err := s.signedIn(ctx, d)
	if err != nil {
		s.showPageError(w, internalPageError(err))
		return
	}
	if len(accounts) == 0 {
		s.render(w, http.StatusOK, "account", data, "")
		return
	}
	a := accounts[0]
	if chosen, ok := findAccount(accounts, r.URL.Query().Get("did")); ok {
		a = chosen
	}
	if r.URL.Query().Get("done") == "revoked" {
		data.Notice = "Access removed. The app can no longer use your account."
	}
	data.Account, data.Accounts = a, accounts
	grants, err := s.ListGrants(ctx, a.DID)
	if err != nil {
		s.showPageError(w, internalPageError(err))
		return
	}
	for _, g := range grants {
		data.Grants = append(data.Grants, grantView{
			ID: g.ID, ClientID: g.ClientID, Created: formatTime(g.CreatedAt), LastUsed: formatTime(g.LastUsed),
			Permissions: DescribeScope(g.Permissions),
			Sets:        s.describeGrantSets(g.Scope),
		})
	}
	s.render(w, http.StatusOK, "account", data, "")
}

func (s *Server) handleAccountPost(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d, ok := s.readPagePost(w, r, errAccountFormExpired)
	if !ok {
		return
	}
	if r.PostFormValue("action") == "signin" {
		a, refused, err := s.login(ctx, r)
		if err != nil {
			s.showPageError(w, internalPageError(err))
			return
		}
		if refused != nil {
			loginRefused(w, refused.status)
			id := r.PostFormValue("identifier")
			if len(id) > maxIdentifierLen {
				id = ""
			}
			s.render(w, refused.status, "account", &pageData{Title: accountTitle, CSRF: s.csrfToken(d),
				Error: refused.msg, Notice: refused.notice, AskCode: refused.askCode,
				Identifier: id, FormAction: PathAccount}, "")
			return
		}
		if _, err := s.signInDevice(ctx, w, r, d, a.DID); err != nil {
			s.showPageError(w, internalPageError(err))
			return
		}
		seeOther(w, a.DID, "")
		return
	}
	accounts, err := s.signedIn(ctx, d)
	if err != nil {
		s.showPageError(w, internalPageError(err))
		return
	}
	a, ok := findAccount(accounts, r.PostFormValue("did"))
	if !ok {
		s.showPageError(w, &pageError{status: http.StatusUnauthorized, title: "You are not signed in",
			message: "That account is not signed in on this browser any more.", cause: nil})
		return
	}
	switch r.PostFormValue("action") {
	case "revoke":
		err := s.RevokeGrant(ctx, a.DID, r.PostFormValue("grant"))
		if err != nil && !errors.Is(err, ErrGrantNotFound) {
			s.showPageError(w, internalPageError(err))
			return
		}
		s.log.Info("grant revoked by its account", "did", a.DID)
		seeOther(w, a.DID, "revoked")
	case "signout":
		if err := s.signOutDevice(ctx, d, a.DID); err != nil {
			s.showPageError(w, internalPageError(err))
			return
		}
		seeOther(w, "", "")
	default:
		s.showPageError(w, &pageError{status: http.StatusBadRequest, title: "This form could not be read", message: "Go back and try again."})
	}
}

// seeOther sends the browser back to the account page (post/redirect/get).
func seeOther(w http.ResponseWriter, did syntax.DID, done string) {
	q := url.Values{}
	if did != "" {
		q.Set("did", string(did))
	}
	if done != "" {
		q.Set("done", done)
	}
	target := PathAccount
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusSeeOther)
}
