package config

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProxyDefaults(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil)
	require.NoError(t, err)
	require.Equal(t, "https://api.bsky.app", c.AppViewURL)
	require.Equal(t, "did:web:api.bsky.app", c.AppViewDID)
	require.Equal(t, "https://mod.bsky.app", c.ModServiceURL)
	require.Equal(t, "did:plc:ar7c4by46qjdydhdevvrndac", c.ModServiceDID)
	require.Equal(t, "https://mod.bsky.app", c.ReportServiceURL)
	require.Equal(t, "did:plc:ar7c4by46qjdydhdevvrndac", c.ReportServiceDID)
	require.Equal(t, 10*time.Second, c.ProxyHeaderTimeout)
	require.Equal(t, 30*time.Second, c.ProxyBodyTimeout)
	require.Equal(t, int64(10<<20), c.ProxyMaxResponse)
	require.Equal(t, 60*time.Second, c.ProxyTotalTimeout)
	require.Equal(t, int64(8<<10), c.ProxyMinRate)
	require.Equal(t, 16, c.ProxyMaxPerClient)
	require.Empty(t, c.ProxyAllowPrivate)
}

func TestProxySettingsFromEnvAndFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"BULWARK_MOD_SERVICE_URL":      "https://ozone.example.com",
		"BULWARK_MOD_SERVICE_DID":      "did:web:ozone.example.com",
		"BULWARK_REPORT_SERVICE_URL":   "https://reports.example.com",
		"BULWARK_REPORT_SERVICE_DID":   "did:plc:reports2345reports2345abcd",
		"BULWARK_PROXY_HEADER_TIMEOUT": "3s",
		"BULWARK_PROXY_BODY_TIMEOUT":   "1m",
		"BULWARK_PROXY_MAX_RESPONSE":   "4MiB",
		"BULWARK_PROXY_ALLOW_PRIVATE":  "127.0.0.0/8, 10.1.2.3",
		"BULWARK_PROXY_TOTAL_TIMEOUT":  "2m",
		"BULWARK_PROXY_MIN_RATE":       "1KiB",
		"BULWARK_PROXY_MAX_PER_CLIENT": "4",
		"BULWARK_DNS_SERVER":           "127.0.0.53",
	}
	c, err := parse(t, env, "--proxy-body-timeout", "45s")
	require.NoError(t, err)
	require.Equal(t, "https://ozone.example.com", c.ModServiceURL)
	require.Equal(t, "did:web:ozone.example.com", c.ModServiceDID)
	require.Equal(t, "https://reports.example.com", c.ReportServiceURL)
	require.Equal(t, "did:plc:reports2345reports2345abcd", c.ReportServiceDID)
	require.Equal(t, 3*time.Second, c.ProxyHeaderTimeout)
	require.Equal(t, 45*time.Second, c.ProxyBodyTimeout, "the flag wins")
	require.Equal(t, int64(4<<20), c.ProxyMaxResponse)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/32")}, c.ProxyAllowPrivate)
	require.Equal(t, 2*time.Minute, c.ProxyTotalTimeout)
	require.Equal(t, int64(1<<10), c.ProxyMinRate)
	require.Equal(t, 4, c.ProxyMaxPerClient)
	require.Equal(t, "127.0.0.53:53", c.DNSServer, "port 53 unless given")
	c, err = parse(t, nil, "--dns-server", "[::1]:5353")
	require.NoError(t, err)
	require.Equal(t, "[::1]:5353", c.DNSServer)

	// Both halves of a service empty turns it off.
	c, err = parse(t, nil, "--mod-service-url", "", "--mod-service-did", "")
	require.NoError(t, err)
	require.Empty(t, c.ModServiceURL)
}

func TestProxySettingsInvalid(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"mod did without url", nil, []string{"--mod-service-url", ""}, "--mod-service-url"},
		{"mod url not http", nil, []string{"--mod-service-url", "mod.bsky.app"}, "--mod-service-url"},
		{"report did bad", nil, []string{"--report-service-did", "reports"}, "--report-service-did"},
		{"header timeout zero", nil, []string{"--proxy-header-timeout", "0s"}, "--proxy-header-timeout"},
		{"body timeout negative", nil, []string{"--proxy-body-timeout", "-1s"}, "--proxy-body-timeout"},
		{"max response tiny", nil, []string{"--proxy-max-response", "1KiB"}, "--proxy-max-response"},
		{"env bad CIDR", map[string]string{"BULWARK_PROXY_ALLOW_PRIVATE": "localhost"}, nil, "BULWARK_PROXY_ALLOW_PRIVATE"},
		{"total timeout under header timeout", nil, []string{"--proxy-total-timeout", "5s"}, "--proxy-total-timeout"},
		{"min rate zero", nil, []string{"--proxy-min-rate", "0"}, "--proxy-min-rate"},
		{"max per client zero", nil, []string{"--proxy-max-per-client", "0"}, "--proxy-max-per-client"},
		{"dns server a name", nil, []string{"--dns-server", "dns.example.com"}, "--dns-server"},
		{"dns server bad port", nil, []string{"--dns-server", "127.0.0.1:x"}, "--dns-server"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, tt.env, tt.args...)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// A configured service the server's outbound requests could never reach
// stops the server at start-up, with the setting that would let it.
func TestProxyServicesReachable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		want string // "" = accepted
	}{
		{"local app view", []string{"--appview-url", "http://localhost:2584"}, "--appview-url"},
		{"local app view allowed", []string{"--appview-url", "http://localhost:2584", "--proxy-allow-private", "127.0.0.1/32"}, ""},
		{"local app view, IPv6 loopback allowed", []string{"--appview-url", "http://localhost:2584", "--proxy-allow-private", "::1/128"}, ""},
		{"private app view over https", []string{"--appview-url", "https://10.0.0.5"}, "--appview-url"},
		{"private app view, other network allowed", []string{"--appview-url", "https://10.0.0.5", "--proxy-allow-private", "192.168.0.0/16"}, "--appview-url"},
		{"named app view over http", []string{"--appview-url", "http://appview:2584"}, "--appview-url"},
		{"named app view over http, a network allowed", []string{"--appview-url", "http://appview:2584", "--proxy-allow-private", "172.16.0.0/12"}, ""},
		{"public address over http", []string{"--appview-url", "http://8.8.8.8", "--proxy-allow-private", "10.0.0.0/8"}, "--appview-url"},
		{"public address over https", []string{"--appview-url", "https://8.8.8.8"}, ""},
		{"moderation on loopback", []string{"--mod-service-url", "http://[::1]:3000"}, "--mod-service-url"},
		{"reports on loopback", []string{"--report-service-url", "https://127.0.0.1:3000"}, "--report-service-url"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, nil, tt.args...)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, "--proxy-allow-private (BULWARK_PROXY_ALLOW_PRIVATE)")
		})
	}
}
