package pds

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/oauth"
)

// TestOAuthSignInBusy: when every password-hash slot is taken and the
// wait runs out, the OAuth sign-in page answers 503 with Retry-After and
// the sign-in form asking to try again in a few seconds (not an internal
// error); once a slot is free, the same form signs in.
func TestOAuthSignInBusy(t *testing.T) {
	t.Parallel()
	slots := account.NewPasswordSlots(1, 4)
	e := newOAuthEnv(t, oauthEnvOptions{env: func(o *envOptions) {
		o.passwordSlots, o.passwordWait = slots, time.Millisecond
	}})
	u := e.newUser()
	app := e.app("busy", "atproto")
	b := e.browser()
	p := b.Get(e.startFlow(app, u))
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", u.handle)
	form.Set("password", u.pass)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := slots.Acquire(ctx, 1)
	require.NoError(t, err)
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusServiceUnavailable, p.Status, p.Body)
	secs, err := strconv.Atoi(p.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.Positive(t, secs)
	require.Contains(t, p.Body, "The server is busy. Try again in a few seconds.")
	require.Contains(t, p.Body, `id="signin-form"`)

	held.Release()
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	require.Contains(t, p.Body, `id="consent-form"`)
}
