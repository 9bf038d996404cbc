package serverid

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOwnAddresses: a server proves itself for its public URL and for
// plain http to its listen port at an address it is bound to, and for no
// other URL: not another port, not another address of a specific bind.
func TestOwnAddresses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		listen, url string
		own         bool
	}{
		{"127.0.0.1:2583", "http://127.0.0.1:2583", true},
		{"127.0.0.1:2583", "http://localhost:2583", true},
		{"127.0.0.1:2583", "http://127.0.0.1:2584", false},
		{"127.0.0.1:2583", "http://127.0.0.2:2583", false},
		{"127.0.0.1:2583", "https://127.0.0.1:2583", false},
		{"127.0.0.1:2583", "https://pds.example.com", true},
		{"127.0.0.1:2583", "https://evil.example.com", false},
		{"0.0.0.0:2583", "http://10.0.0.5:2583", true},
		{"0.0.0.0:2583", "http://localhost:2583", true},
		{"0.0.0.0:2583", "http://pds.example.com:2583", false},
		{"[::]:2583", "http://[::1]:2583", true},
		{"[::1]:2583", "http://[::1]:2583", true},
		{"[::1]:2583", "http://127.0.0.1:2583", false},
		{"10.0.0.5:2583", "http://localhost:2583", false},
	} {
		u, err := CanonicalURL(tt.url)
		require.NoError(t, err)
		require.Equal(t, tt.own, Addresses{Listen: tt.listen, PublicURL: "https://pds.example.com"}.Own(u), "%+v", tt)
	}
	for _, bad := range []string{"ftp://x", "http://", "http://u:p@h", "http://h/path", "http://h?q=1", "http://h#f"} {
		_, err := CanonicalURL(bad)
		require.Error(t, err, bad)
	}
	u, err := CanonicalURL("HTTP://LocalHost:2583/")
	require.NoError(t, err)
	require.Equal(t, "http://localhost:2583", u)
}
