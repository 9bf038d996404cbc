package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// waitLimit bounds every wait for the server.
const waitLimit = 30 * time.Second

// The pages need a login; the login sets a strict session cookie; every
// page carries the strict CSP and loads nothing from another host.
func TestLoginAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.newRepo(t, "alice.test")
	b := e.browser(t)

	p := b.get(console.Prefix)
	require.Equal(t, http.StatusSeeOther, p.status)
	require.Equal(t, console.Prefix+"login?next=%2Fadmin%2F", p.header.Get("Location"))

	p = b.login("not the password")
	require.Equal(t, http.StatusUnauthorized, p.status)
	require.Contains(t, p.body, "Wrong password.")

	p = b.login(adminPassword)
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	var session *http.Cookie
	for _, c := range (&http.Response{Header: p.header}).Cookies() {
		if c.Name == "bulwark_console" {
			session = c
		}
	}
	require.NotNil(t, session)
	require.True(t, session.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, session.SameSite)
	require.False(t, session.Secure, "a plain-http development host")
	require.Equal(t, "/admin", session.Path)
	require.WithinDuration(t, time.Now().Add(console.DefaultSessionTTL), session.Expires, time.Minute)

	e.sampler.Sample(context.Background())
	e.newRepo(t, "alice2.test")
	e.sampler.Sample(context.Background())
	over := b.get(console.Prefix)
	require.Equal(t, 3, strings.Count(over.body, `<svg class="spark"`), over.body)
	require.Contains(t, over.body, "Events per minute")
	require.Contains(t, over.body, "In-flight budget")
	require.Regexp(t, `In-flight budget</dt><dd>[0-9.]+ [kMG]?B of [0-9.]+ [kMG]?B in use`, over.body, "the default budget, as serve has it")
	for _, path := range []string{"", "firehose", "firehose?kind=commit&min=100&over=1", "accounts", "accounts?q=alice", "invites", "audit", "audit?subject=x"} {
		p := b.get(console.Prefix + path)
		require.Equal(t, http.StatusOK, p.status, "%s: %s", path, p.body)
		require.Equal(t, console.CSP, p.header.Get("Content-Security-Policy"), path)
		require.Equal(t, "DENY", p.header.Get("X-Frame-Options"))
		require.Equal(t, "no-store", p.header.Get("Cache-Control"))
		require.Empty(t, p.header.Get("Access-Control-Allow-Origin"), "the console is for itself alone")
		require.Equal(t, 1, strings.Count(p.body, "<h1>"), path)
		require.NotRegexp(t, `(src|href)="(https?:)?//`, p.body, "nothing from another host: %s", path)
	}
	require.Contains(t, b.get(console.Prefix+"accounts?q=alice").body, "alice.test")
	css := b.get(console.Prefix + "static/console.css")
	require.Equal(t, http.StatusOK, css.status)
	require.Equal(t, "text/css; charset=utf-8", css.header.Get("Content-Type"))

	// Logging out ends the session, also for a copy of the cookie.
	home := b.get(console.Prefix)
	out := b.post(console.Prefix+"logout", url.Values{"csrf": {home.csrf(t)}})
	require.Equal(t, http.StatusSeeOther, out.status)
	copied := e.browser(t)
	u, _ := url.Parse(e.url + console.Prefix)
	copied.c.Jar.SetCookies(u, []*http.Cookie{{Name: session.Name, Value: session.Value, Path: "/admin"}})
	require.Equal(t, http.StatusSeeOther, copied.get(console.Prefix).status)
}

// Wrong passwords are limited per address like createSession: past the
// consoleLogin limit every attempt is a 429 with Retry-After, even with
// the right password.
func TestLoginRateLimited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{loginRules: []ratelimit.Rule{{Name: "5m", Limit: 3, Window: 5 * time.Minute}}})
	b := e.browser(t)
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, b.login("guess").status)
	}
	p := b.login("guess")
	require.Equal(t, http.StatusTooManyRequests, p.status)
	require.NotEmpty(t, p.header.Get("Retry-After"))
	require.Contains(t, p.body, "Too many login attempts")
	p = b.login(adminPassword)
	require.Equal(t, http.StatusTooManyRequests, p.status)
	require.Equal(t, http.StatusSeeOther, b.get(console.Prefix).status, "not logged in")
}

// A session cookie changed by a byte, or signed with another key, is no
// session: pages send the login form, actions are refused.
func TestTamperedCookieRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	b := e.browser(t)
	b.mustLogin()
	home := b.get(console.Prefix)
	require.Equal(t, http.StatusOK, home.status)
	csrf := home.csrf(t)
	u, _ := url.Parse(e.url + console.Prefix)
	var value string
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "bulwark_console" {
			value = c.Value
		}
	}
	require.NotEmpty(t, value)
	flip := []byte(value)
	flip[5] ^= 'A' ^ 'B'
	if flip[5] == value[5] {
		flip[5] = 'C'
	}
	for _, bad := range []string{string(flip), value[:len(value)-2], "", "not-a-cookie", strings.Repeat("A", 4096)} {
		b.c.Jar.SetCookies(u, []*http.Cookie{{Name: "bulwark_console", Value: bad, Path: "/admin"}})
		p := b.get(console.Prefix)
		require.Equal(t, http.StatusSeeOther, p.status, "cookie %q", bad)
		p = b.post(console.Prefix+"relays/check", url.Values{"csrf": {csrf}})
		require.Equal(t, http.StatusForbidden, p.status, "cookie %q", bad)
	}
}

// Every form action needs the session's CSRF token and a same-origin
// request.
func TestCSRFRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	_, seq := e.newRepo(t, "bob.test")
	b := e.browser(t)
	b.mustLogin()
	csrf := b.get(console.Prefix).csrf(t)
	repair := fmt.Sprintf("%sfirehose/event/%d/repair", console.Prefix, seq)
	for _, form := range []url.Values{
		{"action": {"invalidate"}},
		{"action": {"invalidate"}, "csrf": {"forged"}},
		{"action": {"invalidate"}, "csrf": {csrf + "x"}},
	} {
		p := b.post(repair, form)
		require.Equal(t, http.StatusForbidden, p.status, "%v", form)
		require.Contains(t, p.body, "CSRF")
	}
	// Another session's token does not do either.
	other := e.browser(t)
	other.mustLogin()
	p := other.post(repair, url.Values{"action": {"invalidate"}, "csrf": {csrf}})
	require.Equal(t, http.StatusForbidden, p.status)
	// A cross-site form with the right token is refused too.
	req, err := http.NewRequest(http.MethodPost, e.url+repair, strings.NewReader(url.Values{"action": {"invalidate"}, "csrf": {csrf}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := b.c.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, read(t, resp).status)

	evs, err := e.log.Inspect(context.Background(), eventlog.EventFilter{FromSeq: seq, ToSeq: seq})
	require.NoError(t, err)
	require.False(t, evs[0].Invalidated, "nothing was repaired")
}

// Bad input gets a 4xx page that says what is wrong, never a 500.
func TestBadInputPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	did, seq := e.newRepo(t, "carol.test")
	b := e.browser(t)
	b.mustLogin()
	csrf := b.get(console.Prefix).csrf(t)
	for _, tc := range []struct {
		path   string
		form   url.Values
		status int
		says   string
	}{
		{path: "firehose/event/999999", status: http.StatusNotFound, says: "no event with seq 999999"},
		{path: "firehose/event/999999/confirm?action=rewrite", status: http.StatusNotFound, says: "no event with seq 999999"},
		{path: "firehose/event/999999/repair", form: url.Values{"action": {"rewrite"}}, status: http.StatusNotFound, says: "no event with seq 999999"},
		{path: "firehose/event/abc", status: http.StatusBadRequest, says: "not an event seq"},
		{path: "firehose/event/-4", status: http.StatusBadRequest, says: "not an event seq"},
		{path: fmt.Sprintf("firehose/event/%d/confirm?action=explode", seq), status: http.StatusBadRequest, says: "Unknown repair"},
		{path: fmt.Sprintf("firehose/event/%d/repair", seq), form: url.Values{"action": {"rewrite"}, "reason": {strings.Repeat("r", 501)}}, status: http.StatusBadRequest, says: "longer than 500"},
		{path: "firehose?kind=nope", status: http.StatusBadRequest, says: "Kind must be"},
		{path: "firehose?did=not-a-did", status: http.StatusBadRequest, says: "is not a DID"},
		{path: "firehose?to=x", status: http.StatusBadRequest, says: "must be a seq"},
		{path: "firehose?after=-1", status: http.StatusBadRequest, says: "must be a seq"},
		{path: "firehose?min=-1", status: http.StatusBadRequest, says: "minimum size"},
		{path: "accounts?status=gone", status: http.StatusBadRequest, says: "unknown account status"},
		{path: "accounts?q=" + strings.Repeat("q", 300), status: http.StatusBadRequest, says: "longer than 256"},
		{path: "accounts/did:plc:nobodynobodynobody00000", status: http.StatusNotFound, says: "no account"},
		{path: "accounts/nope", status: http.StatusBadRequest, says: "not a DID"},
		{path: "accounts/" + did.String() + "/status", form: url.Values{"action": {"delete"}}, status: http.StatusBadRequest, says: "Unknown account action"},
		{path: "invites", form: url.Values{"count": {"0"}, "uses": {"1"}}, status: http.StatusBadRequest, says: "between 1 and 100"},
		{path: "audit?before=x", status: http.StatusBadRequest, says: "entry id"},
		{path: "no-such-page", status: http.StatusNotFound, says: "no such console page"},
	} {
		var p page
		if tc.form != nil {
			tc.form.Set("csrf", csrf)
			p = b.post(console.Prefix+tc.path, tc.form)
		} else {
			p = b.get(console.Prefix + tc.path)
		}
		require.Equal(t, tc.status, p.status, "%s: %s", tc.path, p.body)
		require.Contains(t, p.body, tc.says, tc.path)
	}
	// An #account event cannot be rewritten as #sync.
	evs, err := e.log.Inspect(context.Background(), eventlog.EventFilter{DID: did.String(), Kind: eventlog.KindAccount, Limit: 1})
	require.NoError(t, err)
	if len(evs) > 0 {
		p := b.get(fmt.Sprintf("%sfirehose/event/%d/confirm?action=rewrite", console.Prefix, evs[0].Seq))
		require.Equal(t, http.StatusConflict, p.status, p.body)
	}
}

// With the console off, /admin/ is the pds's 404.
func TestConsoleOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{off: true})
	for _, path := range []string{console.Prefix, console.Prefix + "login"} {
		resp, err := http.Get(e.url + path)
		require.NoError(t, err)
		require.Equal(t, http.StatusNotFound, read(t, resp).status, path)
	}
}

// A repair from the console goes through the confirmation page, changes
// the event as the admin API would, and is audited as the console.
func TestRepairFromConsole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	did, seq := e.newRepo(t, "dave.test")
	e.inflate(t, seq, 5_100_000)
	b := e.browser(t)
	b.mustLogin()

	list := b.get(console.Prefix + "firehose?over=1")
	require.Equal(t, http.StatusOK, list.status)
	require.Contains(t, list.body, fmt.Sprintf(">%d</a>", seq))
	require.Contains(t, list.body, "relays drop the connection above 5000000")
	ev := b.get(fmt.Sprintf("%sfirehose/event/%d", console.Prefix, seq))
	require.Contains(t, ev.body, "confirm?action=rewrite")
	confirm := b.get(fmt.Sprintf("%sfirehose/event/%d/confirm?action=rewrite", console.Prefix, seq))
	require.Equal(t, http.StatusOK, confirm.status)
	require.Contains(t, confirm.body, "is replaced by a #sync of the same repository")
	done := b.post(fmt.Sprintf("%sfirehose/event/%d/repair", console.Prefix, seq),
		url.Values{"csrf": {confirm.csrf(t)}, "action": {"rewrite"}, "reason": {"relays stuck"}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	require.Contains(t, done.body, "#sync")

	ctx := context.Background()
	evs, err := e.log.Inspect(ctx, eventlog.EventFilter{FromSeq: seq, ToSeq: seq})
	require.NoError(t, err)
	require.Equal(t, eventlog.KindSync, evs[0].Kind)
	require.Empty(t, evs[0].Problems)
	entries, err := audit.List(ctx, e.pool, fmt.Sprintf("seq:%d", seq), 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, console.AuditActor, entries[0].Actor)
	require.Equal(t, "firehose.rewriteAsSync", entries[0].Action)
	require.Equal(t, "relays stuck", entries[0].Reason)
	require.Contains(t, b.get(console.Prefix+"audit").body, "firehose.rewriteAsSync")

	// Emit a fresh #sync of the repository from the same event's page.
	last := e.lastSeq(t)
	confirm = b.get(fmt.Sprintf("%sfirehose/event/%d/confirm?action=emit-sync", console.Prefix, seq))
	done = b.post(fmt.Sprintf("%sfirehose/event/%d/repair", console.Prefix, seq), url.Values{"csrf": {confirm.csrf(t)}, "action": {"emit-sync"}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	e.seqs.wait(t, wctx, last+1)
	evs, err = e.log.Inspect(ctx, eventlog.EventFilter{FromSeq: last + 1, DID: did.String()})
	require.NoError(t, err)
	require.Equal(t, eventlog.KindSync, evs[0].Kind)
}
