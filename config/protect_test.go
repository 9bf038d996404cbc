package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAdminPasswordLength: an admin password set to fewer than 16
// characters stops start-up with an error naming the setting by flag and
// environment variable; 16 is enough, and the generated one is longer.
func TestAdminPasswordLength(t *testing.T) {
	t.Parallel()
	_, err := parse(t, nil, "--admin-password", strings.Repeat("x", MinAdminPasswordLen-1))
	require.ErrorContains(t, err, "BULWARK_ADMIN_PASSWORD")
	require.ErrorContains(t, err, "--admin-password")
	require.ErrorContains(t, err, "at least 16 characters")
	require.NotContains(t, err.Error(), strings.Repeat("x", MinAdminPasswordLen-1), "the password is not echoed")

	_, err = parse(t, map[string]string{"BULWARK_ADMIN_PASSWORD": "short"}, "--data-dir", t.TempDir())
	require.ErrorContains(t, err, "BULWARK_ADMIN_PASSWORD")

	// Characters, not bytes: 15 two-byte runes are still too short.
	_, err = parse(t, nil, "--admin-password", strings.Repeat("é", MinAdminPasswordLen-1))
	require.ErrorContains(t, err, "BULWARK_ADMIN_PASSWORD")

	c, err := parse(t, nil, "--admin-password", strings.Repeat("x", MinAdminPasswordLen))
	require.NoError(t, err)
	require.Len(t, c.AdminPassword, MinAdminPasswordLen)

	// The generated password passes the same rule; a short one written
	// into the secrets file by hand does not.
	dir := t.TempDir()
	c, err = parse(t, nil, "--data-dir", dir)
	require.NoError(t, err)
	_, err = c.EnsureSecrets()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(c.AdminPassword), MinAdminPasswordLen)
	require.NoError(t, checkAdminPassword(c.AdminPassword))
	require.NoError(t, os.WriteFile(filepath.Join(dir, SecretsDir, AdminPasswordFile), []byte("hunter2\n"), 0o600))
	c, err = parse(t, nil, "--data-dir", dir)
	require.NoError(t, err)
	_, err = c.EnsureSecrets()
	require.ErrorContains(t, err, "--admin-password")
}

// TestProtectSettings: the outbound allow list takes CIDRs but refuses
// one that allows everything; the DNS server is an address and port; the
// listRecords page bound must hold one record of the largest size.
func TestProtectSettings(t *testing.T) {
	t.Parallel()
	c, err := parse(t, map[string]string{"BULWARK_PROXY_ALLOW_PRIVATE": "10.0.0.0/8, 192.168.1.7"})
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32")}, c.ProxyAllowPrivate)
	require.Equal(t, int64(DefaultListMaxBytes), c.ListMaxBytes)

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-allow-private", "0.0.0.0/0"}, "BULWARK_PROXY_ALLOW_PRIVATE"},
		{[]string{"--proxy-allow-private", "::/0"}, "--proxy-allow-private"},
		{[]string{"--proxy-allow-private", "10.0.0.0/33"}, "proxy-allow-private"},
		{[]string{"--list-max-bytes", "512KiB"}, "BULWARK_LIST_MAX_BYTES"},
		{[]string{"--dns-server", "dns.example.com:53"}, "BULWARK_DNS_SERVER"},
	} {
		_, err := parse(t, nil, tt.args...)
		require.ErrorContains(t, err, tt.want, tt.args)
	}
	c, err = parse(t, map[string]string{"BULWARK_DNS_SERVER": "[::1]:5353"})
	require.NoError(t, err)
	require.Equal(t, "[::1]:5353", c.DNSServer)
	c, err = parse(t, nil, "--list-max-bytes", "8MiB")
	require.NoError(t, err)
	require.Equal(t, int64(8<<20), c.ListMaxBytes)
}
