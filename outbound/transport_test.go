package outbound

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Transport keeps the guard and the size bound but leaves redirects to the
// caller's http.Client: a proxy that relays nothing but the final answer
// sees the redirect itself.
func TestTransportBoundsBodiesAndLeavesRedirectsToTheCaller(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "/", http.StatusFound)
			return
		}
		_, _ = io.WriteString(w, strings.Repeat("x", 100))
	}))
	noFollow := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	refused := &http.Client{Transport: newTestClient(t, Config{}, nil).Transport(0), CheckRedirect: noFollow}
	_, err := refused.Get(s.URL + "/")
	require.ErrorIs(t, err, ErrForbiddenScheme)
	s.requireUntouched(t)

	c := newTestClient(t, Config{AllowCIDRs: prefixes("127.0.0.0/8")}, nil)
	hc := &http.Client{Transport: c.Transport(50), CheckRedirect: noFollow}
	_, err = hc.Get(s.URL + "/")
	require.ErrorIs(t, err, ErrResponseTooLarge)

	resp, err := hc.Get(s.URL + "/moved")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode)

	whole := &http.Client{Transport: c.Transport(100), CheckRedirect: noFollow}
	resp, err = whole.Get(s.URL + "/")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Len(t, b, 100)
}
