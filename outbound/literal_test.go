package outbound

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLiteralHosts(t *testing.T) {
	t.Parallel()
	got := LiteralHosts([]string{
		"http://127.0.0.1:2470", "https://[::ffff:10.0.0.7]/", "10.1.2.3", "http://localhost:9", "https://relay.example.com",
		"https://192.168.1.1.nip.io", "", "http://[fe80::1%25eth0]:80", "::not a url",
	})
	want := []netip.Prefix{
		netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.7/32"), netip.MustParsePrefix("10.1.2.3/32"),
		netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fe80::1/128"),
	}
	require.Equal(t, fmt.Sprint(want), fmt.Sprint(got))
}
