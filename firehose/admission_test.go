package firehose_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/firehose"
)

func TestAdmissionBucket(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{MaxPerClient: 100})
	ip := netip.MustParseAddr("192.0.2.1")
	now := time.Unix(1_700_000_000, 0)
	for range 5 {
		tk, _, err := a.Admit(ip, now)
		require.NoError(t, err)
		tk.Release()
	}
	_, retry, err := a.Admit(ip, now)
	require.ErrorIs(t, err, firehose.ErrRateLimited)
	require.InDelta(t, time.Minute.Seconds(), retry.Seconds(), 1)
	// Hammering does not push the next admission further out.
	for range 1000 {
		_, _, err = a.Admit(ip, now)
		require.ErrorIs(t, err, firehose.ErrRateLimited)
	}
	tk, _, err := a.Admit(ip, now.Add(time.Minute))
	require.NoError(t, err)
	tk.Release()
	// Another client has its own bucket; IPv4-mapped IPv6 is the same client.
	_, _, err = a.Admit(netip.MustParseAddr("::ffff:192.0.2.1"), now.Add(time.Minute))
	require.ErrorIs(t, err, firehose.ErrRateLimited)
	tk, _, err = a.Admit(netip.MustParseAddr("192.0.2.2"), now)
	require.NoError(t, err)
	tk.Release()
	tk.Release() // idempotent
	require.Zero(t, a.Active())
}

func TestAdmissionIPv6Prefix(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{Burst: 2, MaxPerClient: 100})
	now := time.Unix(1_700_000_000, 0)
	for i := range 2 {
		_, _, err := a.Admit(netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i+1)), now)
		require.NoError(t, err)
	}
	_, _, err := a.Admit(netip.MustParseAddr("2001:db8::ffff:1"), now)
	require.ErrorIs(t, err, firehose.ErrRateLimited, "one /64 is one client")
	_, _, err = a.Admit(netip.MustParseAddr("2001:db8:0:1::1"), now)
	require.NoError(t, err)
}

func TestAdmissionConcurrencyCaps(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{
		Rate: rate.Inf, Burst: 1000, MaxPerClient: 2, MaxSubscribers: 3,
		Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	now := time.Now()
	one := netip.MustParseAddr("192.0.2.1")
	t1, _, err := a.Admit(one, now)
	require.NoError(t, err)
	_, _, err = a.Admit(one, now)
	require.NoError(t, err)
	_, _, err = a.Admit(one, now)
	require.ErrorIs(t, err, firehose.ErrTooManyFromClient)
	// The allowlisted relay skips the per-client cap but not the global one.
	_, _, err = a.Admit(netip.MustParseAddr("10.1.2.3"), now)
	require.NoError(t, err)
	_, _, err = a.Admit(netip.MustParseAddr("10.1.2.3"), now)
	require.ErrorIs(t, err, firehose.ErrServerFull)
	t1.Release()
	_, _, err = a.Admit(netip.MustParseAddr("10.1.2.3"), now)
	require.NoError(t, err)
}

func TestAdmissionAllowlistSkipsRate(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{Allow: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")}})
	relay := netip.MustParseAddr("198.51.100.7")
	for range 100 {
		tk, _, err := a.Admit(relay, time.Now())
		require.NoError(t, err)
		tk.Release()
	}
}

// TestAdmissionTableBounded: a flood from many addresses cannot grow the
// table past its cap, and idle clients are forgotten.
func TestAdmissionTableBounded(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{MaxClients: 1000})
	now := time.Unix(1_700_000_000, 0)
	for i := range 100_000 {
		ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		tk, _, err := a.Admit(ip, now)
		require.NoError(t, err)
		tk.Release()
		require.LessOrEqual(t, a.Clients(), 1000)
	}
	// Clients idle for a full refill are forgotten as new ones arrive.
	later := now.Add(10 * time.Minute)
	for i := range 100 {
		_, _, err := a.Admit(netip.AddrFrom4([4]byte{172, 16, 0, byte(i)}), later)
		require.NoError(t, err)
	}
	require.Less(t, a.Clients(), 1000)
}

// TestAdmissionForgive: a client refused for its rate is admitted at once
// after Forgive (a repair of the event it was stuck on), at the address
// Health records for it; the concurrency cap still holds.
func TestAdmissionForgive(t *testing.T) {
	t.Parallel()
	a := firehose.NewAdmission(firehose.AdmissionConfig{Burst: 2, MaxPerClient: 3})
	ip := netip.MustParseAddr("2001:db8::7")
	now := time.Unix(1_700_000_000, 0)
	var held []*firehose.Ticket
	for range 2 {
		tk, _, err := a.Admit(ip, now)
		require.NoError(t, err)
		held = append(held, tk)
	}
	_, _, err := a.Admit(ip, now)
	require.ErrorIs(t, err, firehose.ErrRateLimited)

	a.Forgive("not an address")
	a.Forgive("2001:db8::8") // the same /64
	tk, _, err := a.Admit(ip, now)
	require.NoError(t, err, "forgiven: admitted before its bucket refills")
	held = append(held, tk)
	a.Forgive(ip.String())
	_, _, err = a.Admit(ip, now)
	require.ErrorIs(t, err, firehose.ErrTooManyFromClient, "the concurrency cap is not forgiven")
	for _, tk := range held {
		tk.Release()
	}
	a.Forgive("192.0.2.99") // unknown: nothing to forget, nothing added
	require.Equal(t, 1, a.Clients())
}
