package main

import (
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// slot is a place where the server expects a value of one purpose.
type slot struct {
	name string
	// own are the purposes whose values belong here.
	own []string
	// accepts presents v and reports whether the server took it for what
	// the slot expects.
	accepts func(t *testing.T, v string) bool
	// control, when set, makes a fresh value of the slot's own purpose
	// for the final check (one an earlier control would have spent).
	control func(t *testing.T) string
}

// TestEverySignedValueHasOnePurpose collects one value of every purpose
// the server signs or issues (console cookies and CSRF tokens, OAuth
// cookie, CSRF token, codes and tokens, the DPoP nonce, session,
// app-password and service-auth JWTs, mailed codes) from `bulwark serve`,
// and presents each in every slot where a value is expected: each is
// refused wherever a value of another purpose belongs, and, last, each
// slot accepts its own.
func TestEverySignedValueHasOnePurpose(t *testing.T) {
	t.Parallel()
	s := &purposeServer{liveServer: startLiveServer(t, serverOptions{})}
	s.public = "http://" + s.hostname
	s.raw = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	values := map[string]string{}
	owner := s.newUser(t, "alicia")
	mailbox := s.newUser(t, "bettina")
	s.accountValues(t, owner, values)
	s.emailCodes(t, mailbox, values)
	s.consoleValues(t, values)
	first, second := s.oauthValues(t, owner, values)
	for p, v := range values {
		require.NotEmpty(t, v, p)
	}

	slots := append(append(s.consoleSlots(values), s.oauthSlots(values, first, second)...), s.accountSlots(owner, mailbox)...)
	names := make([]string, 0, len(values))
	for p := range values {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, sl := range slots {
		for _, p := range names {
			if !contains(sl.own, p) {
				require.False(t, sl.accepts(t, values[p]), "the %s was accepted as a %s", p, sl.name)
			}
		}
	}
	// The controls, in an order where none spends what a later one needs.
	for _, sl := range slots {
		if sl.control != nil {
			require.True(t, sl.accepts(t, sl.control(t)), "a fresh %s was refused", sl.name)
			continue
		}
		for _, p := range sl.own {
			require.True(t, sl.accepts(t, values[p]), "the %s was refused as a %s", p, sl.name)
		}
	}
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// consoleSlots are the console's: its two cookies and two CSRF fields.
func (s *purposeServer) consoleSlots(values map[string]string) []slot {
	session := func(v string) []*http.Cookie { return []*http.Cookie{{Name: "bulwark_console", Value: v}} }
	login := func(v string) []*http.Cookie { return []*http.Cookie{{Name: "bulwark_console_login", Value: v}} }
	return []slot{
		{name: "console session cookie", own: []string{pConsoleSession}, accepts: func(t *testing.T, v string) bool {
			resp, _ := s.send(t, http.MethodGet, "/admin/", nil, session(v), nil)
			return resp.StatusCode == http.StatusOK
		}},
		{name: "console login cookie", own: []string{pConsoleLogin}, accepts: func(t *testing.T, v string) bool {
			// A login attempt the server knows is continued: no new cookie.
			resp, _ := s.send(t, http.MethodGet, "/admin/login", nil, login(v), nil)
			for _, c := range resp.Cookies() {
				if c.Name == "bulwark_console_login" {
					return false
				}
			}
			return resp.StatusCode == http.StatusOK
		}},
		{name: "console login CSRF token", own: []string{pConsoleLoginCSRF}, accepts: func(t *testing.T, v string) bool {
			form := url.Values{"csrf": {v}, "password": {s.adminPassword(t)}}
			resp, _ := s.send(t, http.MethodPost, "/admin/login", form, login(values[pConsoleLogin]), nil)
			return resp.StatusCode == http.StatusSeeOther
		}},
		{name: "console session CSRF token", own: []string{pConsoleSessionCSRF}, accepts: func(t *testing.T, v string) bool {
			resp, _ := s.send(t, http.MethodPost, "/admin/relays/check", url.Values{"csrf": {v}}, session(values[pConsoleSession]), nil)
			return resp.StatusCode == http.StatusSeeOther
		}},
	}
}

// oauthSlots are the authorization server's and the resource server's:
// first has its tokens, second an unexchanged code.
func (s *purposeServer) oauthSlots(values map[string]string, first, second *oauthClient) []slot {
	device := func(v string) []*http.Cookie { return []*http.Cookie{{Name: "bulwark-device", Value: v}} }
	return []slot{
		{name: "OAuth device cookie", own: []string{pOAuthDevice}, accepts: func(t *testing.T, v string) bool {
			_, body := s.send(t, http.MethodGet, oauth.PathAccount, nil, device(v), nil)
			return strings.Contains(body, "alicia.test")
		}},
		{name: "OAuth page CSRF token", own: []string{pOAuthCSRF}, accepts: func(t *testing.T, v string) bool {
			// An action no page offers: past the CSRF check it is a 400.
			form := url.Values{"csrf_token": {v}, "action": {"none"}}
			resp, _ := s.send(t, http.MethodPost, oauth.PathAccount, form, device(values[pOAuthDevice]), nil)
			return resp.StatusCode != http.StatusForbidden
		}},
		{name: "OAuth request_uri", own: []string{pOAuthRequestURI}, accepts: func(t *testing.T, v string) bool {
			resp, _ := s.send(t, http.MethodGet, strings.TrimPrefix(first.authorizeURL(v), s.public), nil, nil, nil)
			return resp.StatusCode == http.StatusOK
		}},
		{name: "OAuth authorization code", own: []string{pOAuthCode}, accepts: func(t *testing.T, v string) bool {
			status, _ := second.exchange(t, v)
			return status == http.StatusOK
		}},
		{name: "OAuth access token (DPoP)", own: []string{pOAuthAccess}, accepts: func(t *testing.T, v string) bool {
			return first.resource(t, v) == http.StatusOK
		}},
		{name: "OAuth refresh token", own: []string{pOAuthRefresh}, accepts: func(t *testing.T, v string) bool {
			status, _ := first.post(t, oauth.PathToken, url.Values{"grant_type": {"refresh_token"}, "client_id": {first.id}, "refresh_token": {v}})
			return status == http.StatusOK
		}},
	}
}

// accountSlots are the XRPC methods' credentials: owner's session tokens
// and mailbox's mailed codes. The controls of the codes that end an
// account or its codes use accounts made for them.
func (s *purposeServer) accountSlots(owner, mailbox *purposeUser) []slot {
	ok := func(t *testing.T, method, nsid, token string, body any) bool {
		status, _ := s.xrpc(t, method, nsid, token, nil, body, nil)
		return status == http.StatusOK
	}
	apps := 0
	deleting := mailbox
	return []slot{
		{name: "Bearer token", own: []string{pAccess, pAppPassAccess}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodGet, "com.atproto.server.getSession", v, nil)
		}},
		{name: "full-access session (not an app password's)", own: []string{pAccess}, accepts: func(t *testing.T, v string) bool {
			apps++
			return ok(t, http.MethodPost, "com.atproto.server.createAppPassword", v, map[string]string{"name": "slot " + strconv.Itoa(apps)})
		}},
		{name: "service-auth JWT for createAccount", own: []string{pServiceAuth}, accepts: func(t *testing.T, v string) bool {
			// Past the JWT, the DID is found to be hosted here already: a
			// 400, not the 401 of a refused JWT.
			status, _ := s.xrpc(t, http.MethodPost, "com.atproto.server.createAccount", v, nil,
				map[string]string{"did": owner.did, "handle": "moved.test", "email": "moved@example.com", "password": "a long password"}, nil)
			return status != http.StatusUnauthorized
		}},
		{name: "refresh JWT", own: []string{pRefresh, pAppPassRefresh}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.server.refreshSession", v, nil)
		}},
		{name: "confirm_email code", own: []string{pConfirmEmail}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.server.confirmEmail", mailbox.access, map[string]string{"email": mailbox.email, "token": v})
		}},
		{name: "plc_operation code", own: []string{pPLCOperation}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.identity.signPlcOperation", mailbox.access, map[string]string{"token": v})
		}},
		{name: "update_email code", own: []string{pUpdateEmail}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.server.updateEmail", mailbox.access, map[string]string{"email": "elsewhere@example.com", "token": v})
		}},
		{name: "reset_password code", own: []string{pResetPassword}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.server.resetPassword", "", map[string]string{"token": v, "password": "a brand new password"})
		}, control: func(t *testing.T) string {
			spare := s.newUser(t, "carmen")
			return s.code(t, spare, "com.atproto.server.requestPasswordReset", map[string]string{"email": spare.email}, "reset_password")
		}},
		{name: "delete_account code", own: []string{pDeleteAccount}, accepts: func(t *testing.T, v string) bool {
			return ok(t, http.MethodPost, "com.atproto.server.deleteAccount", "", map[string]string{"did": deleting.did, "password": deleting.password, "token": v})
		}, control: func(t *testing.T) string {
			deleting = s.newUser(t, "dora")
			return s.code(t, deleting, "com.atproto.server.requestAccountDelete", nil, "delete_account")
		}},
	}
}
