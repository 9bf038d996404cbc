package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/internal/browsertest"
)

// tab is a headless Chromium tab.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func newTab(t *testing.T) *tab {
	t.Helper()
	ctx := browsertest.New(t)
	return &tab{t: t, ctx: ctx}
}

// shown is what a console page shows: its heading and whether it is an
// error page.
type shown struct {
	H1    string `json:"h1"`
	Error string `json:"error"`
	Main  string `json:"main"`
}

const shownScript = `(() => ({
  h1: (document.querySelector('main h1') || {}).textContent || '',
  error: (document.querySelector('main .error[role=alert]') || {}).textContent || '',
  main: (document.querySelector('main') || {}).textContent || '',
}))()`

// open runs steps that load a page (a navigation or a click), and
// requires a 200 whose page has heading h1 and is no error page.
func (b *tab) open(h1 string, steps ...chromedp.Action[chromedp.Void]) shown {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, steps...)
	require.NoError(b.t, err, "opening %q", h1)
	got, err := chromedp.Run(b.ctx, chromedp.Evaluate[shown](shownScript))
	require.NoError(b.t, err)
	require.Equal(b.t, int64(http.StatusOK), resp.Status, "%q: %s", h1, got.Main)
	require.Equal(b.t, h1, got.H1, got.Main)
	require.Empty(b.t, got.Error, "%q is an error page", h1)
	return got
}

func (b *tab) click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Click(sel, chromedp.NodeVisible)
}

// TestConsoleThroughServe starts `bulwark serve` as the README's quick
// start does (default settings: the managed Postgres, the development
// PLC, the in-flight budget on), makes accounts as its banner says, and
// in headless Chromium logs in to the console with the password from the
// data dir and opens every page of its navigation and one of each
// drill-down: each answers 200 with its own heading, none is an error
// page.
func TestConsoleThroughServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary with a managed Postgres")
	}
	t.Parallel()
	b := newTab(t)
	bin := buildBinary(t)
	dataDir := managedDataDir(t)
	port := strconv.Itoa(freePort(t))
	base := "http://localhost:" + port
	p := startBinary(t, bin, base, append(cleanEnv(), "BULWARK_DATA_DIR="+dataDir, "BULWARK_LISTEN=127.0.0.1:"+port))
	require.Contains(t, p.logs.String(), "development PLC at "+base)

	// An account as the banner makes it, and one with a post, so the
	// firehose holds a #commit with an operation.
	firstDID := runFirstAccountCommand(t, bin, p.logs.String(), base)
	status, acct := createAccount(t, base, "poster.test")
	require.Equal(t, http.StatusOK, status, "%v", acct)
	post, _ := json.Marshal(map[string]any{"repo": acct["did"], "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "hello", "createdAt": "2026-01-01T00:00:00Z"}})
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/com.atproto.repo.createRecord", bytes.NewReader(post))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+acct["accessJwt"].(string))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The login page, reached from the console's start, says where the
	// password is; the password is read from there.
	passwordFile := filepath.Join(dataDir, config.SecretsDir, "admin-password")
	login := b.open("Log in", chromedp.Navigate(base+"/admin/"))
	require.Contains(t, login.Main, passwordFile)
	pw, err := os.ReadFile(passwordFile)
	require.NoError(t, err)
	require.NotContains(t, login.Main, strings.TrimSpace(string(pw)))
	require.NoError(t, chromedp.Do(b.ctx, chromedp.SendKeys(`#password`, strings.TrimSpace(string(pw)))))
	over := b.open("Overview", b.click(`form.login button[type=submit]`))
	require.Contains(t, over.Main, "In-flight budget")

	// Every page of the navigation, and the brand link.
	for _, nav := range []struct{ path, h1 string }{
		{"firehose", "Firehose"}, {"accounts", "Accounts"}, {"invites", "Invite codes"}, {"audit", "Audit log"}, {"", "Overview"},
	} {
		b.open(nav.h1, b.click(`nav a[href="/admin/`+nav.path+`"]`))
	}
	b.open("Overview", b.click(`a.brand`))

	// Drill-downs: the newest event (the post's #commit, with its
	// operation), its repair confirmation, the paging link, an account,
	// the audit log of one subject.
	b.open("Firehose", b.click(`nav a[href="/admin/firehose"]`))
	seq, err := chromedp.Run(b.ctx, chromedp.Text(`main table tbody tr:first-child td:first-child`, chromedp.NodeVisible))
	require.NoError(t, err)
	seq = strings.TrimSpace(seq)
	ev := b.open("Event "+seq, b.click(`main table tbody tr:first-child a`))
	require.Contains(t, ev.Main, "Operations")
	require.Contains(t, ev.Main, "app.bsky.feed.post/")
	b.open("Rewrite as #sync: event "+seq, b.click(`a[href$="confirm?action=rewrite"]`))
	b.open("Firehose", b.click(`nav a[href="/admin/firehose"]`))
	b.open("Firehose", b.click(`p.paging a`))
	b.open("Accounts", b.click(`nav a[href="/admin/accounts"]`))
	b.open("poster.test", b.click(`main table a[href="/admin/accounts/`+acct["did"].(string)+`"]`))
	b.open("Audit log", b.click(`nav a[href="/admin/audit"]`))
	require.NoError(t, chromedp.Do(b.ctx, chromedp.SendKeys(`#subject`, firstDID)))
	audit := b.open("Audit log", b.click(`form.filter button`))
	require.Contains(t, audit.Main, "com.atproto.server.createAccount", "the banner's account create is the admin's")
	b.open("Log in", b.click(`form.logout button`))
}
