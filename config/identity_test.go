package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIdentityDefaults: where DIDs go and who may sign up follow from
// whether the host name is local, unless set.
func TestIdentityDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		plcURL  string
		devPLC  bool
		invites bool
	}{
		{"default", nil, nil, "http://localhost:2583", true, false},
		{"listen port", nil, []string{"--listen", "0.0.0.0:8080"}, "http://localhost:8080", true, false},
		{"test domain", nil, []string{"--hostname", "pds.test"}, "http://pds.test", true, false},
		{"private address with port", nil, []string{"--hostname", "192.168.1.20:2583", "--handle-domains", ".test"}, "http://192.168.1.20:2583", true, false},
		{"own URL as PLC", nil, []string{"--hostname", "localhost:2583", "--plc-url", "http://LOCALHOST:2583/"}, "http://localhost:2583", true, false},
		{"local directory", nil, []string{"--plc-url", "http://127.0.0.1:2582"}, "http://127.0.0.1:2582", false, false},
		{"public", nil, []string{"--hostname", "pds.example.com"}, "https://plc.directory", false, true},
		{"public, invites off", map[string]string{"BULWARK_INVITE_REQUIRED": "false"}, []string{"--hostname", "pds.example.com"}, "https://plc.directory", false, false},
		{"public, invites off by flag", nil, []string{"--hostname", "pds.example.com", "--invite-required=false"}, "https://plc.directory", false, false},
		{"local, invites on", nil, []string{"--invite-required"}, "http://localhost:2583", true, true},
		{"public with a port, local PLC", nil, []string{"--hostname", "pds.example.com:8443", "--plc-url", "http://10.0.0.2:2582"}, "http://10.0.0.2:2582", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parse(t, tt.env, tt.args...)
			require.NoError(t, err)
			require.Equal(t, tt.plcURL, c.PLCURL)
			require.Equal(t, tt.devPLC, c.DevPLC)
			require.Equal(t, tt.invites, c.InviteRequired)
		})
	}
}

// TestPublicPLCNeverGetsHTTP: a public directory with a plain-http PDS URL
// stops the server at start-up, and the error names both settings.
func TestPublicPLCNeverGetsHTTP(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--plc-url", "https://plc.directory"},
		{"--hostname", "localhost:2583", "--plc-url", "https://plc.directory"},
		{"--hostname", "pds.test", "--plc-url", "https://plc.example.com:8443"},
		{"--hostname", "pds.example.com:8443"},
		{"--hostname", "10.0.0.5", "--handle-domains", ".test", "--plc-url", "https://plc.directory/"},
	} {
		_, err := parse(t, nil, args...)
		require.Error(t, err, "%v", args)
		require.ErrorContains(t, err, "BULWARK_HOSTNAME", "%v", args)
		require.ErrorContains(t, err, "BULWARK_PLC_URL", "%v", args)
		require.ErrorContains(t, err, "plain http", "%v", args)
	}
}

// TestBound: a host name derived from port 0 gets the real port, and the
// development PLC follows; a configured host name stays.
func TestBound(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil, "--listen", "127.0.0.1:0")
	require.NoError(t, err)
	require.Equal(t, "localhost", c.Hostname)
	require.True(t, c.HostnameDerived())
	require.NoError(t, c.Bound("127.0.0.1:41234"))
	require.Equal(t, "127.0.0.1:41234", c.Listen)
	require.Equal(t, "localhost:41234", c.Hostname)
	require.Equal(t, "http://localhost:41234", c.PublicURL())
	require.Equal(t, "http://localhost:41234", c.PLCURL)
	require.Equal(t, "did:web:localhost%3A41234", c.ServiceDID())

	c, err = parse(t, nil, "--listen", "127.0.0.1:0", "--hostname", "pds.test")
	require.NoError(t, err)
	require.NoError(t, c.Bound("127.0.0.1:41234"))
	require.Equal(t, "pds.test", c.Hostname)
	require.False(t, c.HostnameDerived())
	require.Equal(t, "http://pds.test", c.PLCURL)
	require.Error(t, c.Bound("nonsense"))
}

// TestSettings: every setting once, by flag and variable, secrets hidden.
func TestSettings(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil, "--admin-password", "hunter2hunter2hunter2", "--database-url", "postgres://u:dbsecret@db/bulwark")
	require.NoError(t, err)
	got := map[string]string{}
	for _, s := range c.Settings() {
		require.Equal(t, envName(s.Flag), s.Env)
		_, dup := got[s.Env]
		require.False(t, dup, s.Env)
		got[s.Env] = s.Value
	}
	require.Len(t, got, len(c.settings()))
	require.Equal(t, RedactedText, got["BULWARK_ADMIN_PASSWORD"])
	require.NotContains(t, got["BULWARK_DATABASE_URL"], "dbsecret")
	require.Equal(t, "localhost:2583", got["BULWARK_HOSTNAME"])
	require.Equal(t, "http://localhost:2583", got["BULWARK_PLC_URL"])
	require.Equal(t, "false", got["BULWARK_INVITE_REQUIRED"])
}
