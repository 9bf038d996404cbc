package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
)

// atAdmin calls com.atproto.admin.<method> on the server at base with HTTP
// Basic admin:<password> ("" sends no credentials). A nil in makes a GET
// with q; anything else is POSTed as JSON.
func atAdmin(t testing.TB, base, method, password string, in any, q url.Values) xrpcResult {
	t.Helper()
	u := base + "/xrpc/com.atproto.admin." + method
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	httpMethod, body := http.MethodGet, io.Reader(nil)
	if in != nil {
		b, ok := in.([]byte)
		if !ok {
			var err error
			b, err = json.Marshal(in)
			require.NoError(t, err)
		}
		httpMethod, body = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequest(httpMethod, u, body)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if password != "" {
		req.Header.Set("Authorization", "Basic "+basic("admin", password))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *accountEnv) adminQuery(t testing.TB, method string, q url.Values) xrpcResult {
	t.Helper()
	return atAdmin(t, e.url, method, testAdminPassword, nil, q)
}

func (e *accountEnv) adminProc(t testing.TB, method string, in any) xrpcResult {
	t.Helper()
	return atAdmin(t, e.url, method, testAdminPassword, in, nil)
}

// decodeAs decodes a response body into the lexicon type T. Unknown fields
// are refused, so a field the lexicon does not define fails the test.
func decodeAs[T any](t testing.TB, r xrpcResult) *T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body: %s", r.body)
	return &v
}

// auditActions lists the audit entries about subject, oldest first.
func auditActions(t testing.TB, pool *pgxpool.Pool, subject string) []string {
	t.Helper()
	entries, err := audit.List(context.Background(), pool, subject, 0, 100)
	require.NoError(t, err)
	var out []string
	for i := len(entries) - 1; i >= 0; i-- {
		require.Equal(t, "admin", entries[i].Actor)
		out = append(out, entries[i].Action)
	}
	return out
}

func auditCount(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM audit_log").Scan(&n))
	return n
}

// lastAccountEvent decodes did's newest #account event.
func lastAccountEvent(t testing.TB, pool *pgxpool.Pool, did syntax.DID) *comatproto.SyncSubscribeRepos_Account {
	t.Helper()
	var body []byte
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT body FROM events WHERE did = $1 AND kind = 'account' ORDER BY id DESC LIMIT 1", did.String()).Scan(&body))
	var ev comatproto.SyncSubscribeRepos_Account
	require.NoError(t, ev.UnmarshalCBOR(bytes.NewReader(body)))
	return &ev
}

func requireDatetime(t testing.TB, s string) {
	t.Helper()
	_, err := syntax.ParseDatetime(s)
	require.NoError(t, err, "%q is not an atproto datetime", s)
}

func TestAdminAccountsAuth(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	did := u.did.String()
	calls := []struct {
		method string
		in     any
		q      url.Values
	}{
		{"getAccountInfo", nil, url.Values{"did": {did}}},
		{"getAccountInfos", nil, url.Values{"dids": {did}}},
		{"getSubjectStatus", nil, url.Values{"did": {did}}},
		{"getInviteCodes", nil, nil},
		{"updateSubjectStatus", map[string]any{"subject": map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": did}, "takedown": map[string]any{"applied": true}}, nil},
		{"deleteAccount", map[string]any{"did": did}, nil},
		{"updateAccountHandle", map[string]any{"did": did, "handle": "stolen.test"}, nil},
		{"updateAccountEmail", map[string]any{"account": did, "email": "stolen@example.com"}, nil},
		{"updateAccountPassword", map[string]any{"did": did, "password": "stolen password"}, nil},
		{"disableInviteCodes", map[string]any{"accounts": []string{did}}, nil},
		{"enableAccountInvites", map[string]any{"account": did}, nil},
		{"disableAccountInvites", map[string]any{"account": did}, nil},
	}
	before, audits := e.rowCounts(t), auditCount(t, e.pool)
	// Subtests run in turn, not in parallel: the checks after the loop
	// must see all of them done.
	for _, c := range calls {
		t.Run(c.method, func(t *testing.T) {
			atAdmin(t, e.url, c.method, "wrong password", c.in, c.q).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
			atAdmin(t, e.url, c.method, "", c.in, c.q).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
			res := atAdmin(t, e.url, c.method, testAdminPassword+"x", c.in, c.q)
			res.fails(t, http.StatusUnauthorized, "AuthenticationRequired")
			require.NotEmpty(t, res.header.Get("WWW-Authenticate"))
			// A user's session is not admin credentials.
			var body io.Reader
			httpMethod := http.MethodGet
			if c.in != nil {
				b, err := json.Marshal(c.in)
				require.NoError(t, err)
				httpMethod, body = http.MethodPost, bytes.NewReader(b)
			}
			e.do(t, httpMethod, "com.atproto.admin."+c.method, u.access, body, c.q, nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
		})
	}
	require.Equal(t, before, e.rowCounts(t))
	require.Equal(t, audits, auditCount(t, e.pool))
	a, err := e.accounts.Get(context.Background(), u.did)
	require.NoError(t, err)
	require.Equal(t, account.StatusActive, a.Status)
	require.Equal(t, u.handle, a.Handle.String())
	require.False(t, a.InvitesDisabled)
}

func TestAdminGetAccountInfo(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	inviter := e.createUser(t)

	// Two codes made for the inviter; one of them creates the invitee.
	res := e.post(t, "com.atproto.server.createInviteCodes", "", nil)
	res.fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	h := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	b, err := json.Marshal(map[string]any{"codeCount": 2, "useCount": 1, "forAccounts": []string{inviter.did.String()}})
	require.NoError(t, err)
	created := decodeAs[comatproto.ServerCreateInviteCodes_Output](t, e.do(t, http.MethodPost, "com.atproto.server.createInviteCodes", "", bytes.NewReader(b), nil, h).ok(t))
	require.Len(t, created.Codes, 1)
	code := created.Codes[0].Codes[0]
	n := userSeq.Add(1)
	invited := e.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "invited" + itoa(int(n)) + ".test", "email": "Invited" + itoa(int(n)) + "@Example.com",
		"password": "correct horse battery", "inviteCode": code,
	}).ok(t)
	invitee := syntax.DID(invited.str(t, "did"))

	res = e.adminQuery(t, "getAccountInfo", url.Values{"did": {invitee.String()}}).ok(t)
	raw := res.json(t)
	for _, field := range []string{"did", "handle", "indexedAt"} { // required by the lexicon
		require.Contains(t, raw, field)
	}
	view := decodeAs[comatproto.AdminDefs_AccountView](t, res)
	require.Equal(t, invitee.String(), view.Did)
	require.Equal(t, "invited"+itoa(int(n))+".test", view.Handle)
	require.NotNil(t, view.Email)
	require.Equal(t, "invited"+itoa(int(n))+"@example.com", *view.Email)
	requireDatetime(t, view.IndexedAt)
	require.NotNil(t, view.InvitesDisabled)
	require.False(t, *view.InvitesDisabled)
	require.NotNil(t, view.InvitedBy)
	require.Equal(t, code, view.InvitedBy.Code)
	require.Equal(t, inviter.did.String(), view.InvitedBy.ForAccount)
	require.Len(t, view.InvitedBy.Uses, 1)
	require.Equal(t, invitee.String(), view.InvitedBy.Uses[0].UsedBy)
	requireDatetime(t, view.InvitedBy.Uses[0].UsedAt)
	require.Empty(t, view.Invites)

	view = decodeAs[comatproto.AdminDefs_AccountView](t, e.adminQuery(t, "getAccountInfo", url.Values{"did": {inviter.did.String()}}).ok(t))
	require.Nil(t, view.InvitedBy)
	require.Len(t, view.Invites, 2)
	for _, ic := range view.Invites {
		require.Equal(t, inviter.did.String(), ic.ForAccount)
		require.Equal(t, account.InviteAdmin, ic.CreatedBy)
		requireDatetime(t, ic.CreatedAt)
		require.NotNil(t, ic.Uses) // required: [] when unused
	}

	// getAccountInfos: the known accounts in the order asked.
	unknown := "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	res = e.adminQuery(t, "getAccountInfos", url.Values{"dids": {invitee.String(), unknown, inviter.did.String(), invitee.String()}}).ok(t)
	infos := decodeAs[comatproto.AdminGetAccountInfos_Output](t, res)
	require.Len(t, infos.Infos, 2)
	require.Equal(t, invitee.String(), infos.Infos[0].Did)
	require.Equal(t, inviter.did.String(), infos.Infos[1].Did)
	require.Len(t, infos.Infos[1].Invites, 2)
	res = e.adminQuery(t, "getAccountInfos", url.Values{"dids": {unknown}}).ok(t)
	require.JSONEq(t, `{"infos":[]}`, string(res.body))

	// Bad input is a named 400.
	e.adminQuery(t, "getAccountInfo", url.Values{"did": {unknown}}).fails(t, http.StatusBadRequest, "NotFound")
	e.adminQuery(t, "getAccountInfo", url.Values{"did": {"not-a-did"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminQuery(t, "getAccountInfo", nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminQuery(t, "getAccountInfos", nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminQuery(t, "getAccountInfos", url.Values{"dids": {"nope"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	too := make([]string, MaxAccountInfos+1)
	for i := range too {
		too[i] = unknown
	}
	e.adminQuery(t, "getAccountInfos", url.Values{"dids": too}).fails(t, http.StatusBadRequest, "InvalidRequest")
}

func TestAdminAccountWrites(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	other := e.createUser(t)
	ctx := context.Background()
	info := func(did syntax.DID) *comatproto.AdminDefs_AccountView {
		return decodeAs[comatproto.AdminDefs_AccountView](t, e.adminQuery(t, "getAccountInfo", url.Values{"did": {did.String()}}).ok(t))
	}

	// updateAccountHandle: database, PLC document, #identity.
	newHandle := "renamed" + itoa(int(userSeq.Add(1))) + ".test"
	res := e.adminProc(t, "updateAccountHandle", &comatproto.AdminUpdateAccountHandle_Input{Did: u.did.String(), Handle: strings.ToUpper(newHandle)}).ok(t)
	require.Empty(t, bytes.TrimSpace(res.body))
	require.Equal(t, newHandle, info(u.did).Handle)
	kinds := e.eventKinds(t, u.did)
	require.Equal(t, "identity", kinds[len(kinds)-1])
	log := e.plc.Log(u.did.String())
	require.Equal(t, []string{"at://" + newHandle}, log[len(log)-1].Operation.Regular.AlsoKnownAs)

	before := e.rowCounts(t)
	e.adminProc(t, "updateAccountHandle", map[string]any{"did": other.did.String(), "handle": newHandle}).fails(t, http.StatusBadRequest, "HandleNotAvailable")
	e.adminProc(t, "updateAccountHandle", map[string]any{"did": other.did.String(), "handle": "not a handle"}).fails(t, http.StatusBadRequest, "InvalidHandle")
	e.adminProc(t, "updateAccountHandle", map[string]any{"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "handle": "fresh.test"}).fails(t, http.StatusBadRequest, "AccountNotFound")
	e.adminProc(t, "updateAccountHandle", map[string]any{"did": "nope", "handle": "fresh.test"}).fails(t, http.StatusBadRequest, "InvalidRequest")

	// updateAccountEmail, by handle.
	e.adminProc(t, "updateAccountEmail", &comatproto.AdminUpdateAccountEmail_Input{Account: newHandle, Email: "New@Example.com"}).ok(t)
	require.Equal(t, "new@example.com", *info(u.did).Email)
	e.adminProc(t, "updateAccountEmail", map[string]any{"account": other.did.String(), "email": "new@example.com"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateAccountEmail", map[string]any{"account": other.did.String(), "email": "not an email"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateAccountEmail", map[string]any{"account": "nobody.test", "email": "x@example.com"}).fails(t, http.StatusBadRequest, "AccountNotFound")

	// updateAccountPassword ends the sessions.
	e.adminProc(t, "updateAccountPassword", &comatproto.AdminUpdateAccountPassword_Input{Did: u.did.String(), Password: "a new long password"}).ok(t)
	e.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": newHandle, "password": u.pass}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": newHandle, "password": "a new long password"}).ok(t)
	e.adminProc(t, "updateAccountPassword", map[string]any{"did": other.did.String(), "password": "short"}).fails(t, http.StatusBadRequest, "InvalidPassword")
	e.adminProc(t, "updateAccountPassword", map[string]any{"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "password": "long enough really"}).fails(t, http.StatusBadRequest, "AccountNotFound")
	var auditJSON string
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT coalesce(string_agg(after::text, ' '), '') FROM audit_log").Scan(&auditJSON))
	require.NotContains(t, auditJSON, "a new long password")

	// Failed writes changed nothing about other.
	a, err := e.accounts.Get(ctx, other.did)
	require.NoError(t, err)
	require.Equal(t, other.handle, a.Handle.String())
	after := e.rowCounts(t)
	require.Equal(t, before["accounts"], after["accounts"])

	// deleteAccount: gone, with #account deleted.
	e.adminProc(t, "deleteAccount", &comatproto.AdminDeleteAccount_Input{Did: u.did.String()}).ok(t)
	e.adminQuery(t, "getAccountInfo", url.Values{"did": {u.did.String()}}).fails(t, http.StatusBadRequest, "NotFound")
	ev := lastAccountEvent(t, e.pool, u.did)
	require.Equal(t, "deleted", *ev.Status)
	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).fails(t, http.StatusBadRequest, "RepoNotFound")
	require.Equal(t, before["accounts"]-1, e.rowCounts(t)["accounts"])
	e.adminProc(t, "deleteAccount", map[string]any{"did": u.did.String()}).fails(t, http.StatusBadRequest, "AccountNotFound")
	e.adminProc(t, "deleteAccount", map[string]any{"did": ""}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "deleteAccount", []byte(`{"did":`)).fails(t, http.StatusBadRequest, "InvalidRequest")

	require.Equal(t, []string{
		"com.atproto.admin.updateAccountHandle", "com.atproto.admin.updateAccountEmail",
		"com.atproto.admin.updateAccountPassword", "com.atproto.admin.deleteAccount",
	}, auditActions(t, e.pool, u.did.String()))
	require.Empty(t, auditActions(t, e.pool, other.did.String()))
}

func TestAdminInviteCodes(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	h := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	mk := func(forAccounts []string, n int) []string {
		b, err := json.Marshal(map[string]any{"codeCount": n, "useCount": 2, "forAccounts": forAccounts})
		require.NoError(t, err)
		out := decodeAs[comatproto.ServerCreateInviteCodes_Output](t, e.do(t, http.MethodPost, "com.atproto.server.createInviteCodes", "", bytes.NewReader(b), nil, h).ok(t))
		var codes []string
		for _, ac := range out.Codes {
			codes = append(codes, ac.Codes...)
		}
		return codes
	}
	userCodes := mk([]string{u.did.String()}, 2)
	adminCodes := mk(nil, 1)
	used := mk(nil, 1)[0] // newest: a later transaction, a later created_at
	e.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "withcode" + itoa(int(userSeq.Add(1))) + ".test", "email": "withcode" + itoa(int(userSeq.Add(1))) + "@example.com",
		"password": "correct horse battery", "inviteCode": used,
	}).ok(t)

	// Pages of two, newest first, until no cursor.
	var all []*comatproto.ServerDefs_InviteCode
	cursor := ""
	for range 5 {
		q := url.Values{"limit": {"2"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		page := decodeAs[comatproto.AdminGetInviteCodes_Output](t, e.adminQuery(t, "getInviteCodes", q).ok(t))
		all = append(all, page.Codes...)
		if page.Cursor == nil {
			break
		}
		cursor = *page.Cursor
	}
	var got []string
	for _, c := range all {
		got = append(got, c.Code)
		require.NotNil(t, c.Uses)
		requireDatetime(t, c.CreatedAt)
	}
	require.ElementsMatch(t, append(append(append([]string{}, userCodes...), adminCodes...), used), got)
	require.Equal(t, used, got[0])

	byUsage := decodeAs[comatproto.AdminGetInviteCodes_Output](t, e.adminQuery(t, "getInviteCodes", url.Values{"sort": {"usage"}}).ok(t))
	require.Len(t, byUsage.Codes, 4)
	require.Equal(t, used, byUsage.Codes[0].Code)
	require.Len(t, byUsage.Codes[0].Uses, 1)
	require.Equal(t, int64(1), byUsage.Codes[0].Available)
	e.adminQuery(t, "getInviteCodes", url.Values{"sort": {"oldest"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminQuery(t, "getInviteCodes", url.Values{"limit": {"501"}}).fails(t, http.StatusBadRequest, "InvalidRequest")

	disabled := func() map[string]bool {
		out := map[string]bool{}
		page := decodeAs[comatproto.AdminGetInviteCodes_Output](t, e.adminQuery(t, "getInviteCodes", nil).ok(t))
		for _, c := range page.Codes {
			out[c.Code] = c.Disabled
		}
		return out
	}
	e.adminProc(t, "disableInviteCodes", &comatproto.AdminDisableInviteCodes_Input{Codes: adminCodes}).ok(t)
	d := disabled()
	require.True(t, d[adminCodes[0]])
	require.False(t, d[userCodes[0]])
	e.adminProc(t, "disableInviteCodes", &comatproto.AdminDisableInviteCodes_Input{Accounts: []string{u.did.String()}}).ok(t)
	d = disabled()
	require.True(t, d[userCodes[0]] && d[userCodes[1]])
	require.False(t, d[used])
	e.adminProc(t, "disableInviteCodes", map[string]any{"accounts": []string{"admin"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.False(t, disabled()[used])

	// Account invites off and on again, with notes.
	note := "abused invites"
	e.adminProc(t, "disableAccountInvites", &comatproto.AdminDisableAccountInvites_Input{Account: u.did.String(), Note: &note}).ok(t)
	view := decodeAs[comatproto.AdminDefs_AccountView](t, e.adminQuery(t, "getAccountInfo", url.Values{"did": {u.did.String()}}).ok(t))
	require.True(t, *view.InvitesDisabled)
	require.Equal(t, note, *view.InviteNote)
	require.Len(t, view.Invites, 2)
	e.adminProc(t, "enableAccountInvites", &comatproto.AdminEnableAccountInvites_Input{Account: u.did.String()}).ok(t)
	view = decodeAs[comatproto.AdminDefs_AccountView](t, e.adminQuery(t, "getAccountInfo", url.Values{"did": {u.did.String()}}).ok(t))
	require.False(t, *view.InvitesDisabled)
	e.adminProc(t, "enableAccountInvites", map[string]any{"account": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}).fails(t, http.StatusBadRequest, "AccountNotFound")
	e.adminProc(t, "disableAccountInvites", map[string]any{"account": "someone.test"}).fails(t, http.StatusBadRequest, "InvalidRequest")

	require.Equal(t, []string{
		"com.atproto.server.createInviteCodes", "com.atproto.server.createInviteCodes",
		"com.atproto.admin.disableInviteCodes", "com.atproto.admin.disableInviteCodes",
	}, auditActions(t, e.pool, "invite_codes"))
	require.Equal(t, []string{
		"com.atproto.server.createInviteCodes", "com.atproto.admin.disableAccountInvites", "com.atproto.admin.enableAccountInvites",
	}, auditActions(t, e.pool, u.did.String()))
}
