package serverid

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// TestCheckHost: the recorded host decides once there is one; before
// that, the newest active accounts' DID documents do, and one account
// that moved away is no false alarm.
func TestCheckHost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	here := Host{Hostname: "pds.example.com", PublicURL: "https://pds.example.com"}
	other := Host{Hostname: "localhost:2583", PublicURL: "http://localhost:2583"}
	endpoints := map[string]string{}
	resolved := 0
	resolve := func(_ context.Context, did string) (string, error) {
		resolved++
		if e, ok := endpoints[did]; ok {
			return e, nil
		}
		return "", errors.New("directory unreachable")
	}
	pool := dbtest.New(t)
	addAccount := func(did, status string, age time.Duration) {
		_, err := pool.Exec(ctx, `INSERT INTO accounts (did, handle, password_hash, signing_key, status, created_at)
			VALUES ($1, $2, 'x', '\x00', $3, now() - $4::interval)`, did, did[8:]+".test", status, fmt.Sprintf("%d seconds", int(age.Seconds())))
		require.NoError(t, err)
	}

	// No accounts: whatever is configured is recorded.
	warn, err := CheckHost(ctx, pool, other, resolve)
	require.NoError(t, err)
	require.Empty(t, warn)
	_, err = pool.Exec(ctx, "DELETE FROM server_identity")
	require.NoError(t, err)

	// A database from before the record: the newest active account moved
	// away (its document names another PDS), the next is served here.
	addAccount("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "active", time.Hour)
	addAccount("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", "active", time.Minute)
	addAccount("did:plc:cccccccccccccccccccccccc", "deactivated", time.Second)
	endpoints["did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"] = "https://pds.example.com/"
	endpoints["did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"] = "https://elsewhere.example.net"

	_, err = CheckHost(ctx, pool, other, resolve)
	require.ErrorIs(t, err, ErrHostMismatch)
	require.Contains(t, err.Error(), "elsewhere.example.net")
	_, err = RecordedHost(ctx, pool)
	require.ErrorIs(t, err, ErrNoHost, "nothing recorded on a mismatch")

	warn, err = CheckHost(ctx, pool, here, resolve)
	require.NoError(t, err)
	require.Empty(t, warn)
	rec, err := RecordedHost(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, here, rec)

	// Recorded: no resolution any more, and another name is refused.
	resolved = 0
	_, err = CheckHost(ctx, pool, here, resolve)
	require.NoError(t, err)
	_, err = CheckHost(ctx, pool, other, resolve)
	require.ErrorIs(t, err, ErrHostMismatch)
	require.Contains(t, err.Error(), "BULWARK_HOSTNAME=pds.example.com")
	require.Zero(t, resolved)

	// A directory that cannot be reached: a warning, nothing recorded.
	_, err = pool.Exec(ctx, "DELETE FROM server_identity")
	require.NoError(t, err)
	delete(endpoints, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb")
	warn, err = CheckHost(ctx, pool, here, resolve)
	require.NoError(t, err)
	require.Contains(t, warn, "directory unreachable")
	_, err = RecordedHost(ctx, pool)
	require.ErrorIs(t, err, ErrNoHost)
}
