package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
)

func TestBannerText(t *testing.T) {
	t.Parallel()
	secrets := []config.SecretFile{
		{Flag: "admin-password", Path: "/srv/data/secrets/admin-password"},
		{Flag: "jwt-secret", Path: "/srv/data/secrets/jwt-secret"},
		{Flag: "plc-rotation-key", Path: "/srv/data/secrets/plc-rotation-key"},
	}
	local := startInfo{
		Program: "bulwark", URL: "http://localhost:2583",
		DataDir: "/srv/data", DefaultDataDir: "/srv/data",
		DevPLC: true, PLCURL: "http://localhost:2583", SecretFiles: secrets, HandleDomain: ".test",
	}
	tests := []struct {
		name    string
		info    func(startInfo) startInfo
		want    []string
		notWant []string
	}{
		{"defaults", func(i startInfo) startInfo { return i }, []string{
			"URL:            http://localhost:2583\n",
			"development PLC at http://localhost:2583",
			"open, no invite code needed",
			"/srv/data/secrets/admin-password", "jwt-secret", "plc-rotation-key",
			"First account:  bulwark admin account create --handle alice.test --email alice@example.com\n",
			"bulwark config",
		}, []string{"--url", "--data-dir"}},
		{"elsewhere", func(i startInfo) startInfo {
			i.Program, i.DefaultDataDir = "./bin/bulwark", "/home/me/data"
			return i
		}, []string{"./bin/bulwark admin --data-dir /srv/data account create --handle alice.test"}, []string{"--url"}},
		{"public", func(i startInfo) startInfo {
			i.URL, i.DevPLC, i.PLCURL, i.InviteRequired, i.HandleDomain = "https://pds.example.com", false, "https://plc.directory", true, ".pds.example.com"
			i.SecretFiles = secrets[1:]
			i.DataDir = "/var/lib/bulwark data"
			return i
		}, []string{
			"PLC directory:  https://plc.directory\n",
			"invite code required",
			"admin password from BULWARK_ADMIN_PASSWORD; jwt-secret, plc-rotation-key in /srv/data/secrets",
			"bulwark admin --data-dir '/var/lib/bulwark data' account create --handle alice.pds.example.com",
		}, []string{"development PLC"}},
		{"accounts", func(i startInfo) startInfo {
			i.HasAccounts = true
			return i
		}, []string{"Accounts:       bulwark admin account list"}, []string{"First account", "alice"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text := bannerText(tt.info(local))
			for _, w := range tt.want {
				require.Contains(t, text, w)
			}
			for _, w := range tt.notWant {
				require.NotContains(t, text, w)
			}
			require.LessOrEqual(t, strings.Count(text, "\n"), 10, "a few lines:\n%s", text)
		})
	}
	require.Equal(t, "'/var/lib/my data'", shellQuote("/var/lib/my data"))
	require.Equal(t, "http://127.0.0.1:2583", adminURL("0.0.0.0:2583"))
	require.Equal(t, "http://[::1]:2583", adminURL("[::]:2583"))
	require.Equal(t, "http://10.0.0.2:2583", adminURL("10.0.0.2:2583"))
}
