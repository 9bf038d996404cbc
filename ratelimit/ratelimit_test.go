package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/testclock"
)

func setup(t *testing.T, maxKeys int, rules ...Rule) (*Limiter, *testclock.Clock) {
	t.Helper()
	c := testclock.New(time.Unix(1_700_000_000, 0))
	l, err := New(Config{Name: "test", Rules: rules, MaxKeys: maxKeys, Now: c.Now})
	require.NoError(t, err)
	return l, c
}

func TestAllowUpToLimit(t *testing.T) {
	t.Parallel()
	l, c := setup(t, 0, Rule{Name: "1m", Limit: 3, Window: time.Minute})
	for want := 2; want >= 0; want-- {
		ok, retry, remaining := l.Allow("1.2.3.4")
		require.True(t, ok)
		require.Zero(t, retry)
		require.Equal(t, want, remaining)
	}
	ok, retry, remaining := l.Allow("1.2.3.4")
	require.False(t, ok)
	require.Equal(t, 20*time.Second, retry, "one point refills every 20s")
	require.Zero(t, remaining)

	// Refused calls spend nothing: hammering does not push the wait back.
	for range 10 {
		ok, _, _ = l.Allow("1.2.3.4")
		require.False(t, ok)
	}
	c.Advance(20 * time.Second)
	ok, _, _ = l.Allow("1.2.3.4")
	require.True(t, ok)
	ok, _, _ = l.Allow("1.2.3.4")
	require.False(t, ok)

	// Other keys are independent.
	ok, _, remaining = l.Allow("5.6.7.8")
	require.True(t, ok)
	require.Equal(t, 2, remaining)

	s := l.Stats()
	require.Equal(t, uint64(5), s.Allowed)
	require.Equal(t, uint64(12), s.Refused["1m"])
	require.Equal(t, 2, s.Keys)
}

// TestAllWindowsMustAllow mirrors createSession's 30/5m and 300/day with
// smaller numbers: the short window refuses first, then the long one.
func TestAllWindowsMustAllow(t *testing.T) {
	t.Parallel()
	l, c := setup(t, 0,
		Rule{Name: "5m", Limit: 2, Window: 5 * time.Minute},
		Rule{Name: "day", Limit: 3, Window: Day})
	key := Key("alice.example.com", "1.2.3.4")

	d := l.AllowN(key, 1)
	require.True(t, d.Allowed)
	require.Equal(t, "5m", d.Rule.Name, "the 5m rule has fewer points left")
	require.Equal(t, 1, d.Remaining)
	require.True(t, l.AllowN(key, 1).Allowed)

	d = l.AllowN(key, 1)
	require.False(t, d.Allowed)
	require.Equal(t, "5m", d.Rule.Name)
	require.Equal(t, 150*time.Second, d.RetryAfter)

	c.Advance(5 * time.Minute)
	d = l.AllowN(key, 1)
	require.True(t, d.Allowed)
	require.Equal(t, "day", d.Rule.Name)
	require.Zero(t, d.Remaining)

	// The 5m bucket has points again; the day bucket has none.
	c.Advance(5 * time.Minute)
	d = l.AllowN(key, 1)
	require.False(t, d.Allowed)
	require.Equal(t, "day", d.Rule.Name)
	// One point per 8h at 3/day, of which the last 10 minutes refilled some.
	require.Equal(t, 8*time.Hour-10*time.Minute, d.RetryAfter)

	// The refusal by the day rule spent nothing from the 5m rule.
	c.Advance(8 * time.Hour)
	d = l.AllowN(key, 2)
	require.False(t, d.Allowed, "only one day point has refilled")
	d = l.AllowN(key, 1)
	require.True(t, d.Allowed)
}

// TestWritePoints: per-DID write points as in the reference PDS, create 3,
// update 2, delete 1 against 5000/h.
func TestWritePoints(t *testing.T) {
	t.Parallel()
	l, c := setup(t, 0, DefaultPolicies()[PolicyRepoWrite]...)
	did := "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	for range 5000 / WriteCostCreate {
		require.True(t, l.AllowN(did, WriteCostCreate).Allowed)
	}
	// 1666 creates spent 4998 points: no create fits, an update does.
	d := l.AllowN(did, WriteCostCreate)
	require.False(t, d.Allowed)
	require.Equal(t, "hour", d.Rule.Name)
	require.Equal(t, 2, d.Remaining)
	require.True(t, l.AllowN(did, WriteCostUpdate).Allowed)
	require.False(t, l.AllowN(did, WriteCostDelete).Allowed)

	// An hour later the hourly bucket is full; the day has 30,000 left.
	c.Advance(time.Hour)
	d = l.AllowN(did, WriteCostDelete)
	require.True(t, d.Allowed)
	require.Equal(t, "hour", d.Rule.Name)
	require.Equal(t, 4999, d.Remaining)

	// A cost over the limit is never allowed.
	d = l.AllowN(did, 6000)
	require.False(t, d.Allowed)
	require.Equal(t, time.Hour, d.RetryAfter)
}

func TestIdleKeysExpire(t *testing.T) {
	t.Parallel()
	l, c := setup(t, 0, Rule{Name: "1m", Limit: 10, Window: time.Minute})
	for i := range 100 {
		l.Allow(fmt.Sprint("old-", i))
	}
	require.Equal(t, 100, l.Len())

	// Once the window has passed, the old keys are forgotten as new ones
	// arrive (a few per insert), or all at once by Prune.
	c.Advance(time.Minute)
	for i := range 10 {
		l.Allow(fmt.Sprint("new-", i))
	}
	require.Less(t, l.Len(), 100)
	l.Prune()
	require.Equal(t, 10, l.Len())
	require.Zero(t, l.Stats().Evicted, "expiry is not eviction")

	// A forgotten key starts with a full bucket, which is what it would
	// have had anyway.
	_, _, remaining := l.Allow("old-1")
	require.Equal(t, 9, remaining)
}

// TestBoundedMemory: a flood from a million distinct addresses keeps the
// table at MaxKeys.
func TestBoundedMemory(t *testing.T) {
	t.Parallel()
	const maxKeys = 10_000
	n := 1_000_000
	if raceEnabled || testing.Short() {
		// The race detector makes each call ~10x slower; the bound is the
		// same with fewer keys.
		n = 100_000
	}
	l, _ := setup(t, maxKeys, DefaultPolicies()[PolicyGlobal]...)
	var before runtime.MemStats
	if !raceEnabled {
		runtime.GC()
		runtime.ReadMemStats(&before)
	}
	var b [4]byte
	for i := range n {
		b[0], b[1], b[2], b[3] = 10, byte(i>>16), byte(i>>8), byte(i)
		ok, _, _ := l.Allow(netip.AddrFrom4(b).String() + strconv.Itoa(i>>24))
		require.True(t, ok)
	}
	require.LessOrEqual(t, l.Len(), maxKeys)
	require.GreaterOrEqual(t, l.Stats().Evicted, uint64(n-maxKeys))
	if !raceEnabled {
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		// About 150 bytes a key; a generous bound that a million keys
		// (~150 MB) would blow through.
		require.Less(t, grown, int64(maxKeys*1000), "heap grew %d bytes", grown)
		runtime.KeepAlive(l)
	}
}

// TestConcurrentExactLimit: many goroutines on one key get exactly Limit
// allowances between them when no time passes.
func TestConcurrentExactLimit(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, 0, Rule{Name: "1h", Limit: 500, Window: time.Hour})
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if ok, _, _ := l.Allow("shared"); ok {
					allowed.Add(1)
				}
				l.Allow(fmt.Sprint("other-", allowed.Load()))
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(500), allowed.Load())
}

func TestNilAndEmptyLimiterAllow(t *testing.T) {
	t.Parallel()
	var l *Limiter
	ok, _, _ := l.Allow("x")
	require.True(t, ok)
	require.Zero(t, l.Len())
	empty, err := New(Config{Name: "off"})
	require.NoError(t, err)
	require.True(t, empty.AllowN("x", 1000).Allowed)
}

func TestNewRejectsBadRules(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Rules: []Rule{{Name: "a", Limit: 0, Window: time.Minute}}})
	require.Error(t, err)
	_, err = New(Config{Rules: []Rule{{Name: "a", Limit: 1, Window: time.Minute}, {Name: "a", Limit: 2, Window: time.Hour}}})
	require.Error(t, err)
}

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	l, c := setup(t, 0, Rule{Name: "5m", Limit: 2, Window: 5 * time.Minute})
	now := c.Now()

	h := http.Header{}
	SetHeaders(h, l.AllowN("k", 1), now)
	require.Equal(t, "2", h.Get("RateLimit-Limit"))
	require.Equal(t, "1", h.Get("RateLimit-Remaining"))
	require.Equal(t, strconv.FormatInt(now.Unix()+150, 10), h.Get("RateLimit-Reset"))
	require.Equal(t, "2;w=300", h.Get("RateLimit-Policy"))
	require.Empty(t, h.Get("Retry-After"))

	l.AllowN("k", 1)
	h = http.Header{}
	SetHeaders(h, l.AllowN("k", 1), now)
	require.Equal(t, "0", h.Get("RateLimit-Remaining"))
	require.Equal(t, "150", h.Get("Retry-After"))
	require.Equal(t, strconv.FormatInt(now.Unix()+300, 10), h.Get("RateLimit-Reset"))
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, 0, Rule{Name: "5m", Limit: 1, Window: 5 * time.Minute})
	var calls atomic.Int64
	h := Middleware(l, func(r *http.Request) string { return r.Header.Get("X-Test-Client") },
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))

	do := func(client string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/xrpc/com.atproto.server.describeServer", nil)
		req.Header.Set("X-Test-Client", client)
		h.ServeHTTP(rec, req)
		return rec
	}
	require.Equal(t, http.StatusOK, do("a").Code)
	rec := do("a")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "300", rec.Header().Get("Retry-After"))
	require.Equal(t, "1", rec.Header().Get("RateLimit-Limit"))
	var body struct{ Error string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, "RateLimitExceeded", body.Error)
	require.Equal(t, int64(1), calls.Load(), "a refused request never reaches the handler")

	// An empty key bypasses the limiter.
	require.Equal(t, http.StatusOK, do("").Code)
	require.Equal(t, http.StatusOK, do("").Code)
}

func TestParseRules(t *testing.T) {
	t.Parallel()
	rules, err := ParseRules("30/5m, 300/1d")
	require.NoError(t, err)
	require.Equal(t, []Rule{{Name: "5m", Limit: 30, Window: 5 * time.Minute}, {Name: "1d", Limit: 300, Window: Day}}, rules)
	for _, off := range []string{"", "off"} {
		rules, err = ParseRules(off)
		require.NoError(t, err)
		require.Empty(t, rules)
	}
	for _, bad := range []string{"30", "x/5m", "0/5m", "30/0s", "30/abc", "30/xd"} {
		_, err = ParseRules(bad)
		require.ErrorIs(t, err, ErrBadRule, bad)
	}
}

func TestIPKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, "192.0.2.1", IPKey(netip.MustParseAddr("192.0.2.1")))
	require.Equal(t, "192.0.2.1", IPKey(netip.MustParseAddr("::ffff:192.0.2.1")))
	require.Equal(t, IPKey(netip.MustParseAddr("2001:db8::1")), IPKey(netip.MustParseAddr("2001:db8::ffff:2")))
	require.NotEqual(t, IPKey(netip.MustParseAddr("2001:db8::1")), IPKey(netip.MustParseAddr("2001:db8:0:1::1")))
	require.NotEqual(t, Key("a b", "c"), Key("a", "b c"))
}

func TestDefaultSet(t *testing.T) {
	t.Parallel()
	policies := DefaultPolicies()
	policies[PolicyUploadBlob] = nil // turned off by configuration
	s, err := NewSet(policies, 0)
	require.NoError(t, err)
	require.Nil(t, s.Get(PolicyUploadBlob))
	require.True(t, s.Get(PolicyUploadBlob).AllowN("did:plc:x", 1).Allowed)
	require.Len(t, s.All(), len(policies)-1)
	require.Equal(t, []Rule{{Name: "5m", Limit: 30, Window: 5 * time.Minute}, {Name: "day", Limit: 300, Window: Day}},
		s.Get(PolicyCreateSession).Rules())
}

func BenchmarkAllowSameKey(b *testing.B) {
	l := MustNew(Config{Name: "bench", Rules: DefaultPolicies()[PolicyGlobal]})
	b.ReportAllocs()
	for b.Loop() {
		l.Allow("192.0.2.1")
	}
}

func BenchmarkAllowTwoWindows(b *testing.B) {
	l := MustNew(Config{Name: "bench", Rules: DefaultPolicies()[PolicyRepoWrite]})
	b.ReportAllocs()
	for b.Loop() {
		l.AllowN("did:plc:ewvi7nxzyoun6zhxrhs64oiz", WriteCostDelete)
	}
}

// BenchmarkAllowDistinctKeys is the flood case: every call is a new key,
// so every call inserts and, once the table is full, evicts. It also
// reports the heap per tracked key.
func BenchmarkAllowDistinctKeys(b *testing.B) {
	const maxKeys = 50_000
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	l := MustNew(Config{Name: "bench", Rules: DefaultPolicies()[PolicyGlobal], MaxKeys: maxKeys})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Allow(keys[i&(len(keys)-1)])
		i++
	}
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if n := l.Len(); n > 0 {
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "heap-B/key")
	}
	runtime.KeepAlive(l)
	runtime.KeepAlive(keys)
}

func BenchmarkAllowParallel(b *testing.B) {
	l := MustNew(Config{Name: "bench", Rules: DefaultPolicies()[PolicyGlobal]})
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := "192.0.2." + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			l.Allow(key)
		}
	})
}

// TestRefund: points given back make room again, never beyond a rule's
// limit, and a key never seen stays untracked.
func TestRefund(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, 0, Rule{Name: "1m", Limit: 2, Window: time.Minute}, Rule{Name: "1h", Limit: 3, Window: time.Hour})
	for range 2 {
		ok, _, _ := l.Allow("a")
		require.True(t, ok)
	}
	ok, _, _ := l.Allow("a")
	require.False(t, ok)
	l.Refund("a", 1)
	ok, _, remaining := l.Allow("a")
	require.True(t, ok)
	require.Zero(t, remaining)
	l.Refund("a", 100)
	d := l.AllowN("a", 1)
	require.True(t, d.Allowed)
	require.Equal(t, 1, d.Remaining, "refunds stop at each rule's limit")
	l.Refund("never", 1)
	require.Equal(t, 1, l.Len())
}
