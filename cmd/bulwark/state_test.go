package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// rowBound is how many rows an anonymous burst may add to a table: so many
// per sign-up the server accepted, per pushed authorization request it
// accepted, per operation the development PLC accepted, and per password
// reset answered.
type rowBound struct {
	signup, par, plcOp, reset int
}

// tableBounds names the bound of every table of the schema. A table
// missing here fails TestAnonymousBurstLeavesBoundedState: an anonymous
// burst must leave it unchanged, or its growth must follow from one of
// the few things anyone may do without an account, each under a
// per-address rate limit.
var tableBounds = map[string]rowBound{
	"goose_db_version": {},
	// A sign-up: the account, its repository (root, the empty tree's
	// node), its DID's genesis, its session, and the #identity, #account
	// and #sync events.
	"accounts":           {signup: 1},
	"repo_roots":         {signup: 1},
	"repo_nodes":         {signup: 1},
	"dev_plc_operations": {signup: 1, plcOp: 1},
	"refresh_tokens":     {signup: 1},
	"events":             {signup: 3},
	// A password reset for an existing address: its code, and the mail
	// that carries it.
	"email_outbox": {reset: 1},
	"email_tokens": {reset: 1},
	// A pushed authorization request: the request, and its PKCE
	// challenge and state, each used once.
	"oauth_requests":    {par: 1},
	"oauth_used_values": {par: 2},
	// The nodes of the cluster on this database, the leases of their
	// singleton jobs and the facts they agree on: written by nodes
	// starting and leading, never by a request.
	"cluster_facts":  {},
	"cluster_leases": {},
	"cluster_nodes":  {},
	// Nothing without a sign-in.
	"account_preferences":   {},
	"app_passwords":         {},
	"audit_log":             {},
	"blobs":                 {},
	"console_sessions":      {},
	"invite_code_uses":      {},
	"invite_codes":          {},
	"oauth_device_accounts": {},
	"oauth_devices":         {},
	"oauth_grants":          {},
	"oauth_spent_refresh":   {},
	"record_blobs":          {},
	"records":               {},
	"sequencer_state":       {},
	"server_identity":       {},
	"service_auth_used":     {},
	"takedowns":             {},
}

// TestAnonymousBurstLeavesBoundedState: a burst of anonymous requests at
// every public route (the route table of TestEveryPublicRouteIsLimited),
// each with junk and with plausible input (an existing account's names,
// and fresh ones a sign-up would use), plus the anonymous actions that do
// store something (sign-ups, pushed authorization requests, operations
// for the development PLC, password resets) and the ones that cost the
// server work (resolving foreign handles, firehose upgrades, the console
// and OAuth sign-in pages with wrong passwords), until each is refused
// with 429, leaves the row count of every table of the schema unchanged
// or within its bound (tableBounds), with sign-up open and by invitation.
func TestAnonymousBurstLeavesBoundedState(t *testing.T) {
	t.Parallel()
	for _, invites := range []bool{false, true} {
		t.Run("invite required "+strconv.FormatBool(invites), func(t *testing.T) {
			t.Parallel()
			anonymousBurst(t, invites)
		})
	}
}

// burstCounts are the accepted anonymous actions that may store rows.
type burstCounts struct {
	signup, par, plcOp, reset atomic.Int64
}

func anonymousBurst(t *testing.T, inviteRequired bool) {
	// Enough for every input of a method (its plausible ones, then its
	// junk) before the global limit refuses.
	tl := newTinyLimits(14)
	ps := startPublicServer(t, "--ratelimits", tl.flag, "--refusal-cooloff", "0", "--appview-url", fakeAppView(t),
		"--proxy-allow-private", "127.0.0.1/32", "--invite-required="+strconv.FormatBool(inviteRequired))
	acct := ps.existingAccount(t, inviteRequired)
	lex := loadLexicons(t)
	routes := concretize(ps.srv.Routes())
	before := ps.rowCounts(t)
	var counts burstCounts

	inParallel(routes, 6, func(c concreteRoute) {
		res := burst(ps, tl, c, 20, anonymousRequests(ps, lex, acct, c))
		if res.problem != "" {
			t.Error(res.problem)
		}
		counts.note(c, res)
	})
	// The anonymous actions that store rows, each until refused.
	signups := ps.signUps(t, acct)
	counts.signup.Add(int64(signups))
	if inviteRequired {
		require.Zero(t, signups, "signed up without an invite")
	} else {
		require.Positive(t, signups, "no sign-up went through: the burst would prove nothing")
		require.LessOrEqual(t, signups, tl.limit[ratelimit.PolicyCreateAccount])
	}
	pars := ps.pushedRequests(t)
	counts.par.Add(int64(pars))
	require.Positive(t, pars)
	ops := ps.plcGenesisOps(t, acct)
	counts.plcOp.Add(int64(ops))
	require.Positive(t, ops)
	ps.foreignHandles(t)
	ps.firehoseUpgrades(t)
	ps.wrongPasswords(t, acct)

	after := ps.rowCounts(t)
	var report []string
	for table, n := range after {
		b, ok := tableBounds[table]
		if !ok {
			t.Errorf("table %s has no bound: name one in tableBounds", table)
			continue
		}
		bound := b.signup*int(counts.signup.Load()) + b.par*int(counts.par.Load()) + b.plcOp*int(counts.plcOp.Load()) + b.reset*int(counts.reset.Load())
		grew := n - before[table]
		report = append(report, fmt.Sprintf("%-24s +%d (bound %d)", table, grew, bound))
		if grew > bound {
			t.Errorf("%s grew by %d rows, more than its bound %d (%+v per action; %d sign-ups, %d PARs, %d PLC operations, %d resets)",
				table, grew, bound, b, counts.signup.Load(), counts.par.Load(), counts.plcOp.Load(), counts.reset.Load())
		}
	}
	sort.Strings(report)
	for line := range strings.Lines(ps.logs.String()) {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("logged as a failure: %.500s", line)
		}
	}
	t.Logf("%d routes; %d sign-ups, %d PARs, %d PLC operations, %d resets accepted:\n%s", len(routes),
		counts.signup.Load(), counts.par.Load(), counts.plcOp.Load(), counts.reset.Load(), strings.Join(report, "\n"))
}

// note counts the actions a route burst had accepted.
func (bc *burstCounts) note(c concreteRoute, res burstResult) {
	switch c.String() {
	case "POST /xrpc/com.atproto.server.createAccount":
		bc.signup.Add(int64(res.statuses[http.StatusOK]))
	case "POST /xrpc/com.atproto.server.requestPasswordReset":
		bc.reset.Add(int64(res.statuses[http.StatusOK]))
	case "POST " + oauth.PathPAR:
		bc.par.Add(int64(res.statuses[http.StatusCreated]))
	case "POST /" + plausibleDID:
		bc.plcOp.Add(int64(res.statuses[http.StatusOK]))
	}
}

// anonymousRequests makes the i-th request of a route's burst: for an
// XRPC method, its plausible inputs (fresh names first), then its junk,
// in turn; for any other route, an empty request or an empty JSON body.
func anonymousRequests(ps *publicServer, lex map[string]lexMethod, acct inputAccount, c concreteRoute) func(i int) *http.Request {
	nsid, isXRPC := strings.CutPrefix(c.path, "/xrpc/")
	if !isXRPC {
		return func(i int) *http.Request { return requestTo(ps, c, []string{"{}", "", "x=1"}[i%3]) }
	}
	m, ok := lex[nsid]
	if !ok {
		m = genericMethod
	}
	procedure := c.method == http.MethodPost
	plausible := plausibleInputs(m, procedure, acct)
	inputs := append([]xrpcInput{plausible[len(plausible)-1]}, plausible[:len(plausible)-1]...)
	inputs = append(inputs, junkInputs(m, procedure)...)
	return func(i int) *http.Request {
		req, err := inputs[i%len(inputs)].newRequest(ps.url, nsid, procedure)
		if err != nil {
			panic(err)
		}
		return req
	}
}

// rowCounts counts the rows of every table of the database.
func (ps *publicServer) rowCounts(t *testing.T) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := ps.pool.Query(ctx, `SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`)
	require.NoError(t, err)
	type table struct{ schema, name string }
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var tb table
		return tb, r.Scan(&tb.schema, &tb.name)
	})
	require.NoError(t, err)
	require.Greater(t, len(tables), 20)
	out := map[string]int{}
	for _, tb := range tables {
		var n int
		q := "SELECT count(*) FROM " + pgx.Identifier{tb.schema, tb.name}.Sanitize()
		require.NoError(t, ps.pool.QueryRow(ctx, q).Scan(&n))
		out[tb.name] = n
	}
	return out
}

// xrpcJSON calls nsid with a JSON body (nil: a GET) from client, returning
// the status and decoding a 200's answer into out.
func (ps *publicServer) xrpcJSON(t *testing.T, client *http.Client, nsid string, body any, header http.Header, out any) int {
	t.Helper()
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		method, rd = http.MethodPost, strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, ps.url+"/xrpc/"+nsid, rd)
	require.NoError(t, err)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode == http.StatusOK && out != nil {
		require.NoError(t, json.Unmarshal(raw, out), "%s: %s", nsid, raw)
	}
	return resp.StatusCode
}

// existingAccount signs up the account the plausible inputs name (with an
// invite code from the admin when sign-up needs one). Its password stays
// here: the anonymous requests try a wrong one.
func (ps *publicServer) existingAccount(t *testing.T, inviteRequired bool) inputAccount {
	t.Helper()
	c := newSourceClient()
	var desc struct {
		AvailableUserDomains []string `json:"availableUserDomains"`
	}
	require.Equal(t, http.StatusOK, ps.xrpcJSON(t, c, "com.atproto.server.describeServer", nil, nil, &desc))
	acct := inputAccount{handle: "existing" + desc.AvailableUserDomains[0], email: "existing@example.com",
		password: "wrong-password", domain: desc.AvailableUserDomains[0]}
	in := map[string]any{"handle": acct.handle, "email": acct.email, "password": "the-right-password"}
	if inviteRequired {
		var code struct {
			Code string `json:"code"`
		}
		admin := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+ps.cfg.AdminPassword))}}
		require.Equal(t, http.StatusOK, ps.xrpcJSON(t, c, "com.atproto.server.createInviteCode", map[string]any{"useCount": 1}, admin, &code))
		in["inviteCode"] = code.Code
	}
	var out struct {
		DID string `json:"did"`
	}
	require.Equal(t, http.StatusOK, ps.xrpcJSON(t, c, "com.atproto.server.createAccount", in, nil, &out))
	acct.did = out.DID
	return acct
}

// untilRefused calls send from one new address until it answers 429, and
// returns how many answers were ok(status).
func untilRefused(t *testing.T, max int, send func(c *http.Client) int, ok func(status int) bool) int {
	t.Helper()
	c := newSourceClient()
	defer c.CloseIdleConnections()
	accepted := 0
	for range max {
		status := send(c)
		if status == http.StatusTooManyRequests {
			return accepted
		}
		if ok(status) {
			accepted++
		}
	}
	t.Fatalf("no 429 after %d requests", max)
	return 0
}

// signUps signs up fresh accounts from one address until refused.
func (ps *publicServer) signUps(t *testing.T, acct inputAccount) int {
	return untilRefused(t, 10, func(c *http.Client) int {
		n := strconv.FormatInt(freshSeq.Add(1), 36)
		in := map[string]any{"handle": "signup" + n + acct.domain, "email": "signup" + n + "@example.com", "password": "signup-password"}
		return ps.xrpcJSON(t, c, "com.atproto.server.createAccount", in, nil, nil)
	}, func(s int) bool { return s == http.StatusOK })
}

// pushedRequests pushes valid authorization requests of a development app
// (a localhost client_id, whose metadata is not fetched) from one address
// until refused, and opens each in the sign-in page.
func (ps *publicServer) pushedRequests(t *testing.T) int {
	clientID := "http://localhost?" + url.Values{"redirect_uri": {"http://127.0.0.1/callback"}, "scope": {"atproto"}}.Encode()
	key := dpoptest.NewKey()
	var uris []string
	n := untilRefused(t, 10, func(c *http.Client) int {
		status, uri := ps.par(t, c, key, parForm(clientID, "http://127.0.0.1/callback"))
		if uri != "" {
			uris = append(uris, uri)
		}
		return status
	}, func(s int) bool { return s == http.StatusCreated })
	page := newSourceClient()
	for _, u := range uris {
		resp, err := page.Get(ps.url + oauth.PathAuthorize + "?" + url.Values{"client_id": {clientID}, "request_uri": {u}}.Encode())
		require.NoError(t, err)
		resp.Body.Close()
	}
	return n
}
