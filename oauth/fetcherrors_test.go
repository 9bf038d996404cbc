package oauth_test

import (
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/outbound"
)

// TestClientFetchErrorsSayNothingOfTheFetch: when a client's metadata
// cannot be fetched, the app is told so in fixed words; what the fetch met
// (the address refused, the resolver's answer) goes to the log only.
func TestClientFetchErrorsSayNothingOfTheFetch(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	f := setup(t, fixtureOpts{configure: func(c *oauth.Config) {
		// The real outbound client, which refuses this test server's
		// loopback address.
		c.HTTPClient = outbound.New(outbound.Config{Logger: logger}).HTTPClient()
		c.Logger = logger
	}})
	c := f.rawClient("guarded", "atproto")
	for _, id := range []string{c.clientID, "https://no-such-host.invalid/client.json"} {
		form := c.parForm()
		form.Set("client_id", id)
		a := c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
		require.Equal(t, http.StatusUnauthorized, a.status, id)
		require.Equal(t, "invalid_client", a.str("error"))
		require.Equal(t, "the client metadata document could not be fetched", a.str("error_description"), id)
	}
	require.Contains(t, logs.String(), "127.0.0.1")
	require.Contains(t, logs.String(), "no-such-host.invalid")
}
