package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/oauth"
)

// TestServeOAuthSignInCode: serve, started as the README starts it with
// mail (--smtp-url), for an account that turned on email sign-in codes:
// the OAuth sign-in page mails the code once the password is right, asks
// for it, and signs in to the app with the password and the code.
//
// Not parallel: serve registers the mailer with the process-wide metrics
// registry (TestServeSendsMail).
func TestServeOAuthSignInCode(t *testing.T) {
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, logs := startServe(t, ctx, []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(),
		"--listen", "127.0.0.1:0", "--handle-domains", ".test",
		"--smtp-url", sink.URL(), "--email-from", "Bulwark <noreply@pds.test>"})
	base := "http://" + addr
	_, port, _ := strings.Cut(addr, ":")
	public := "http://localhost:" + port
	nextCode := func() string {
		select {
		case m := <-sink.Mails():
			return emailtest.Parse(t, m).Code(t)
		case <-time.After(waitLimit):
			t.Fatalf("no mail arrived; logs:\n%s", logs.String())
			return ""
		}
	}

	const handle, password, address = "alice.test", "alice password", "alice@example.com"
	acct := postOK(t, base, "com.atproto.server.createAccount", "", map[string]any{"handle": handle, "email": address, "password": password})
	did, token := syntax.DID(acct["did"].(string)), acct["accessJwt"].(string)
	postOK(t, base, "com.atproto.server.requestEmailConfirmation", token, nil)
	postOK(t, base, "com.atproto.server.confirmEmail", token, map[string]any{"email": address, "token": nextCode()})
	postOK(t, base, "com.atproto.server.requestEmailUpdate", token, nil)
	postOK(t, base, "com.atproto.server.updateEmail", token, map[string]any{"email": address, "emailAuthFactor": true, "token": nextCode()})

	// The app's callback, on loopback: the browser lands there with the
	// authorization code.
	callback := make(chan url.Values, 1)
	cbSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case callback <- r.URL.Query():
		default:
		}
		_, _ = io.WriteString(w, "<!doctype html><title>back in the app</title><h1>back in the app</h1>")
	}))
	t.Cleanup(cbSrv.Close)
	cfg := indigo.NewLocalhostConfig(cbSrv.URL+"/callback", []string{"atproto", "transition:generic"})
	app := indigo.NewClientApp(&cfg, indigo.NewMemStore())
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: did, Handle: handle,
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: public}}})
	app.Dir = dir
	var md indigo.AuthServerMetadata
	getJSON(t, base+oauth.PathASMetadata, &md)
	info, err := app.SendAuthRequest(ctx, &md, cfg.Scopes, handle)
	require.NoError(t, err)
	info.AccountDID = &did
	require.NoError(t, app.Store.SaveAuthRequestInfo(ctx, *info))
	authURL := md.AuthorizationEndpoint + "?" + url.Values{"client_id": {cfg.ClientID}, "request_uri": {info.RequestURI}}.Encode()

	b := newTab(t)
	submit := func(pw, code string) pageState {
		t.Helper()
		fill := []chromedp.Action[chromedp.Void]{
			chromedp.SetValue(`#identifier`, handle),
			chromedp.SetValue(`#password`, pw),
		}
		if code != "" {
			fill = append(fill, chromedp.SetValue(`#code`, code))
		}
		require.NoError(t, chromedp.Do(b.ctx, fill...))
		resp, err := chromedp.RunResponse(b.ctx, b.click(`#signin-submit`))
		require.NoError(t, err)
		return b.pageState(resp.Status)
	}
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Navigate(authURL))
	require.NoError(t, err)
	p := b.pageState(resp.Status)
	require.Equal(t, int64(http.StatusOK), p.Status, p.Main)
	require.False(t, p.Code, "no code field before the password")

	p = submit("wrong password", "")
	require.Equal(t, int64(http.StatusUnauthorized), p.Status, p.Main)
	require.False(t, p.Code)
	p = submit(password, "")
	require.Equal(t, int64(http.StatusOK), p.Status, p.Main)
	require.True(t, p.Code, "the page asks for the code: %s", p.Main)
	require.Equal(t, handle, p.Identifier, "the identifier is kept")
	require.Empty(t, p.Password, "the password is not put back")
	code := nextCode() // the first mail: the wrong password sent none
	p = submit(password, "AAAAA-AAAAA")
	require.Equal(t, int64(http.StatusUnauthorized), p.Status, p.Main)
	require.Contains(t, p.Error, "That sign-in code is wrong")
	require.True(t, p.Code)
	p = submit(password, code)
	require.Equal(t, int64(http.StatusOK), p.Status, p.Main)
	require.True(t, p.Consent, p.Main)
	require.NoError(t, chromedp.Do(b.ctx, b.click(`#approve`)))
	var params url.Values
	select {
	case params = <-callback:
	case <-time.After(waitLimit):
		t.Fatal("the browser never reached the app's callback")
	}
	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	require.Equal(t, did, data.AccountDID)
	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, public+"/xrpc/com.atproto.server.getSession", nil)
	require.NoError(t, err)
	res, err := sess.DoWithAuth(http.DefaultClient, req, "com.atproto.server.getSession")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	cancel()
	select {
	case exit := <-done:
		require.Equal(t, 0, exit, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
	require.False(t, strings.Contains(logs.String(), code), "no code in the log")
}

// pageState is what an OAuth page shows, as read in the browser.
type pageState struct {
	Status     int64
	Main       string `json:"main"`
	Error      string `json:"error"`
	Code       bool   `json:"code"`
	Consent    bool   `json:"consent"`
	Identifier string `json:"identifier"`
	Password   string `json:"password"`
}

const pageStateScript = `(() => ({
  main: (document.querySelector('main') || document.body).textContent,
  error: (document.querySelector('#error-message') || {}).textContent || '',
  code: !!document.querySelector('#code'),
  consent: !!document.querySelector('#consent-form'),
  identifier: (document.querySelector('#identifier') || {}).value || '',
  password: (document.querySelector('#password') || {}).value || '',
}))()`

// pageState reads the page the tab shows, answered with status.
func (b *tab) pageState(status int64) pageState {
	b.t.Helper()
	got, err := chromedp.Run(b.ctx, chromedp.Evaluate[pageState](pageStateScript))
	require.NoError(b.t, err)
	got.Status = status
	return got
}
