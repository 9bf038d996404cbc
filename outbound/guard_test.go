package outbound

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIsPublic(t *testing.T) {
	t.Parallel()
	public := []string{
		"1.1.1.1", "8.8.8.8", "93.184.215.14", "223.255.255.255",
		"100.63.255.255", "100.128.0.0", // just outside CGNAT
		"172.15.255.255", "172.32.0.0", // just outside 172.16/12
		"192.0.1.1", "192.169.0.0", "198.17.255.255", "198.20.0.0",
		"2606:4700:4700::1111", "2001:4860:4860::8888", "2a00:1450:4001::1",
		"::ffff:8.8.8.8",    // IPv4-mapped public
		"64:ff9b::808:808",  // NAT64 of 8.8.8.8
		"2001:200::1",       // just outside 2001::/23
		"3fff:1000::1",      // just outside 3fff::/20
		"2003::1",           // just outside 2002::/16
		"2001:db9::1",       // just outside documentation
		"64:ff9b::1.1.1.1",  // NAT64 written with a dotted quad
		"::ffff:223.1.2.3",  // mapped
		"2001:4860::8888",   // Google, a /32 outside 2001::/23
		"2c0f:fb50:4003::1", // AFRINIC
	}
	forbidden := []string{
		// IPv4
		"0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255",
		"100.64.0.1", "100.127.255.255", "127.0.0.1", "127.255.255.254",
		"169.254.169.254", "169.254.0.1", "172.16.0.1", "172.31.255.255",
		"192.0.0.1", "192.0.0.170", "192.0.2.1", "192.88.99.1",
		"192.168.1.1", "198.18.0.1", "198.19.255.255", "198.51.100.7",
		"203.0.113.9", "224.0.0.1", "239.255.255.250", "240.0.0.1",
		"255.255.255.255",
		// IPv6
		"::", "::1", "::127.0.0.1", "::8.8.8.8", // IPv4-compatible, deprecated
		"::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:0.0.0.0",
		"64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", // NAT64 of private
		"64:ff9b:1::1", "100::1", "5f00::1",
		"fc00::1", "fd12:3456::1", "fe80::1", "fe80::1%eth0", "febf::1", "fec0::1",
		"ff02::1", "ff0e::1",
		"2001::1", "2001:0:4136:e378::1", // Teredo
		"2001:2::1", "2001:10::1", "2001:20::1", // benchmarking, ORCHID
		"2001:db8::1", "2002:7f00:1::1", "2002:808:808::1", "3fff::1", "3fff:fff::1",
	}
	for _, s := range public {
		require.True(t, IsPublic(netip.MustParseAddr(s)), s)
	}
	for _, s := range forbidden {
		require.False(t, IsPublic(netip.MustParseAddr(s)), s)
	}
	require.False(t, IsPublic(netip.Addr{}))
}

func TestGuardPermitted(t *testing.T) {
	t.Parallel()
	allow := prefixes("10.0.0.0/8", "fd00::/8", "127.0.0.1/32")
	https := newGuard(allow, true, ErrForbiddenAddress, &fakeResolver{}, slog.Default(), nil)
	plain := newGuard(allow, false, errPlainHTTP, &fakeResolver{}, slog.Default(), nil)
	cases := []struct {
		addr         string
		https, plain bool
	}{
		{"8.8.8.8", true, false},
		{"2606:4700:4700::1111", true, false},
		{"10.1.2.3", true, true},
		{"::ffff:10.1.2.3", true, true},
		{"fd00::1", true, true},
		{"fe80::1%eth0", false, false},
		{"127.0.0.1", true, true},
		{"127.0.0.2", false, false},
		{"192.168.0.1", false, false},
		{"169.254.169.254", false, false},
	}
	for _, c := range cases {
		a := netip.MustParseAddr(c.addr)
		require.Equal(t, c.https, https.permitted(a), "https %s", c.addr)
		require.Equal(t, c.plain, plain.permitted(a), "plain %s", c.addr)
	}

	// The socket-level check refuses what the address check refuses.
	require.ErrorIs(t, https.control("tcp", "169.254.169.254:80", nil), ErrForbiddenAddress)
	require.ErrorIs(t, https.control("tcp", "[::1]:443", nil), ErrForbiddenAddress)
	require.ErrorIs(t, plain.control("tcp", "8.8.8.8:80", nil), ErrForbiddenScheme)
	require.NoError(t, https.control("tcp", "8.8.8.8:443", nil))
	require.NoError(t, plain.control("tcp", "10.0.0.1:80", nil))
}

func TestGuardDialFiltersBeforeConnecting(t *testing.T) {
	t.Parallel()
	s := startServer(t, "127.0.0.1", false, text("secret"))
	r := &fakeResolver{hosts: map[string][]netip.Addr{"pds.example.com": addrs("127.0.0.1")}}
	g := newGuard(nil, true, ErrForbiddenAddress, r, slog.Default(), nil)
	g.dialer.Control = nil // the address filter alone, without the socket-level check
	for _, target := range []string{"127.0.0.1:" + s.port(), "pds.example.com:" + s.port(), "[::ffff:127.0.0.1]:" + s.port()} {
		_, err := g.DialContext(context.Background(), "tcp", target)
		require.ErrorIs(t, err, ErrForbiddenAddress, target)
	}
	s.requireUntouched(t)
}
