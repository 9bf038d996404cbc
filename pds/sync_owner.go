package pds

import (
	"net/http"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
)

// availableRepoFor is availableRepo for a request: a deactivated
// account's repository is also served to the account itself (a session of
// that account, which may be deactivated) and to the administrator, as the
// reference PDS does, so that an account can still be moved away after
// it was deactivated and an operator can export it. A taken-down one is
// served to the administrator and to the session the account opened with
// createSession's allowTakendown (so that it can leave with its data). Who asks is looked at only when the
// account is not active, so the common case costs nothing more.
func (s *Server) availableRepoFor(r *http.Request, did syntax.DID) (*repoStatus, error) {
	st, err := s.lookupRepo(r.Context(), did)
	if err != nil {
		return nil, err
	}
	switch {
	case st.status == account.StatusActive:
		return st, nil
	case (st.status == account.StatusDeactivated || st.status == account.StatusTakendown) && s.isAdminRequest(r):
		return st, nil
	case (st.status == account.StatusDeactivated || st.status == account.StatusTakendown) && s.isOwner(r, did):
		return st, nil
	}
	return st.servable(did)
}

// isOwner reports whether r carries a live access token of did's account:
// of an active or deactivated account, or the session a taken-down account
// opened to move away (account.ScopeTakendown), which may export it.
func (s *Server) isOwner(r *http.Request, did syntax.DID) bool {
	token, err := bearerToken(r)
	if err != nil || token == "" || s.accounts == nil {
		return false
	}
	a, err := s.accounts.Authenticate(r.Context(), token)
	return err == nil && a.DID == did && (a.Status != account.StatusTakendown || a.Takendown())
}
