package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// postAsync is a POST of in from ip that may run on any goroutine: the
// result (or the transport error, as its body) arrives on the channel.
func (e *accountEnv) postAsync(ip, nsid string, in any) <-chan xrpcResult {
	done := make(chan xrpcResult, 1)
	go func() { done <- e.send(ip, "", nsid, in) }()
	return done
}

// doAsync is postAsync with a session's token, from the default address.
func (e *accountEnv) doAsync(token, nsid string, in any) xrpcResult {
	return e.send("", token, nsid, in)
}

func (e *accountEnv) send(ip, token, nsid string, in any) xrpcResult {
	b, _ := json.Marshal(in)
	req, err := http.NewRequest(http.MethodPost, e.url+"/xrpc/"+nsid, bytes.NewReader(b))
	if err != nil {
		return xrpcResult{body: []byte(err.Error())}
	}
	req.Header.Set("Content-Type", "application/json")
	if ip != "" {
		req.Header.Set("X-Forwarded-For", ip)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return xrpcResult{body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return xrpcResult{status: resp.StatusCode, header: resp.Header, body: body}
}

// TestConcurrentLoginsAllSucceed: more concurrent logins with the right
// password than there are hash slots (one here) all succeed: the checks
// wait their turn instead of being refused with 503.
func TestConcurrentLoginsAllSucceed(t *testing.T) {
	t.Parallel()
	// Costly enough that the hashes overlap.
	params := account.PasswordParams{Memory: 4 << 10, Time: 1, Threads: 1}
	e := newAccountEnv(t, envOptions{passwordHashes: 1, passwordParams: &params, passwordWait: time.Minute})
	u := e.createUser(t)
	const n = 8
	var waits []<-chan xrpcResult
	for range n {
		waits = append(waits, e.postAsync("", "com.atproto.server.createSession", map[string]any{"identifier": u.handle, "password": u.pass}))
	}
	for _, w := range waits {
		(<-w).ok(t)
	}
}

// queueEnv is a server with one password-hash slot, held by the test so
// that every password check queues, and clients told apart by
// X-Forwarded-For.
type queueEnv struct {
	*accountEnv
	slots *budget.Budget
	held  *budget.Reservation
}

func newQueueEnv(t *testing.T, queue int, wait time.Duration, limits map[string]string) *queueEnv {
	t.Helper()
	policies := ratelimit.DefaultPolicies()
	for name, rules := range limits {
		parsed, err := ratelimit.ParseRules(rules)
		require.NoError(t, err)
		policies[name] = parsed
	}
	set, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	q := &queueEnv{slots: account.NewPasswordSlots(1, queue)}
	q.accountEnv = newAccountEnv(t, envOptions{
		passwordSlots: q.slots, passwordWait: wait,
		configure: func(c *config.Config) {
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
		},
		options: func(o *Options) { o.Limits = set },
	})
	return q
}

// hold takes the only slot until the returned function is called.
func (q *queueEnv) hold(t *testing.T) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := q.slots.Acquire(ctx, 1)
	require.NoError(t, err)
	t.Cleanup(res.Release)
	return res.Release
}

// queued starts a POST from ip and returns once it waits for a hash slot.
func (q *queueEnv) queued(t *testing.T, ip, nsid string, in any) <-chan xrpcResult {
	t.Helper()
	before := q.slots.Stats().QueueLen
	done := q.accountEnv.postAsync(ip, nsid, in)
	require.Eventually(t, func() bool { return q.slots.Stats().QueueLen == before+1 }, time.Minute, time.Millisecond,
		"%s from %s never queued", nsid, ip)
	return done
}

func requireOverloaded(t *testing.T, res xrpcResult) {
	t.Helper()
	res.fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
	secs, err := strconv.Atoi(res.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After: %q", res.header.Get("Retry-After"))
	require.GreaterOrEqual(t, secs, 1)
}

func loginBody(u *user) map[string]any {
	return map[string]any{"identifier": u.handle, "password": u.pass}
}

// TestLoginQueueFull: logins past the queue's last place are answered
// 503 ServiceOverloaded with Retry-After at once, and their login points
// given back; those that queued are served once a slot is free.
func TestLoginQueueFull(t *testing.T) {
	t.Parallel()
	q := newQueueEnv(t, 2, time.Minute, map[string]string{ratelimit.PolicyCreateSession: "3/5m"})
	u := q.createUser(t)
	release := q.hold(t)
	first := q.queued(t, "192.0.2.1", "com.atproto.server.createSession", loginBody(u))
	second := q.queued(t, "192.0.2.2", "com.atproto.server.createSession", loginBody(u))
	requireOverloaded(t, <-q.postAsync("192.0.2.3", "com.atproto.server.createSession", loginBody(u)))
	require.Equal(t, 2, q.slots.Stats().QueueLen)
	release()
	(<-first).ok(t)
	(<-second).ok(t)
	// The refused login cost nothing: the account's third login of three
	// is still allowed.
	q.postFrom(t, "192.0.2.3", "com.atproto.server.createSession", "", loginBody(u)).ok(t)
}

// TestLoginWaitRunsOut: a login that gets no slot within the wait is
// answered 503 with Retry-After, and leaves the queue.
func TestLoginWaitRunsOut(t *testing.T) {
	t.Parallel()
	q := newQueueEnv(t, 8, time.Millisecond, nil)
	u := q.createUser(t)
	q.hold(t)
	requireOverloaded(t, q.postFrom(t, "192.0.2.1", "com.atproto.server.createSession", "", loginBody(u)))
	require.Zero(t, q.slots.Stats().QueueLen)
	require.NotZero(t, q.slots.Stats().Canceled)
}

// TestLoginFloodMeetsBudgetFirst: logins from one address past its login
// budget are refused 429 before they reach the hash queue, so a flood
// holds no more places than its budget.
func TestLoginFloodMeetsBudgetFirst(t *testing.T) {
	t.Parallel()
	q := newQueueEnv(t, 5, time.Minute, map[string]string{ratelimit.PolicyLoginAddress: "2/5m"})
	u := q.createUser(t)
	release := q.hold(t)
	first := q.queued(t, "192.0.2.1", "com.atproto.server.createSession", loginBody(u))
	second := q.queued(t, "192.0.2.1", "com.atproto.server.createSession", loginBody(u))
	requireRefusal(t, q.postFrom(t, "192.0.2.1", "com.atproto.server.createSession", "", loginBody(u)), 2)
	require.Equal(t, 2, q.slots.Stats().QueueLen)
	release()
	(<-first).ok(t)
	(<-second).ok(t)
}

// TestLoginQueueAddressShare: within its budget, one address holds at
// most half the places (1 slot + 5 queued: 3); past that its logins are
// 503 at once while another address still queues.
func TestLoginQueueAddressShare(t *testing.T) {
	t.Parallel()
	q := newQueueEnv(t, 5, time.Minute, nil)
	u := q.createUser(t)
	release := q.hold(t)
	var waits []<-chan xrpcResult
	for range 3 {
		waits = append(waits, q.queued(t, "192.0.2.1", "com.atproto.server.createSession", loginBody(u)))
	}
	requireOverloaded(t, q.postFrom(t, "192.0.2.1", "com.atproto.server.createSession", "", loginBody(u)))
	waits = append(waits, q.queued(t, "192.0.2.2", "com.atproto.server.createSession", loginBody(u)))
	release()
	for _, w := range waits {
		(<-w).ok(t)
	}
}

// TestSignUpsQueue: sign-ups and app-password creation wait for a hash
// slot as logins do, and succeed once one is free.
func TestSignUpsQueue(t *testing.T) {
	t.Parallel()
	q := newQueueEnv(t, 8, time.Minute, nil)
	u := q.createUser(t)
	release := q.hold(t)
	var waits []<-chan xrpcResult
	for i := range 3 {
		waits = append(waits, q.queued(t, fmt.Sprintf("192.0.2.%d", i+1), "com.atproto.server.createAccount", map[string]any{
			"handle": fmt.Sprintf("burst%d%s", i, u.handle), "email": fmt.Sprintf("burst%d@example.com", i), "password": "correct horse battery",
		}))
	}
	before := q.slots.Stats().QueueLen
	appPass := make(chan xrpcResult, 1)
	go func() {
		appPass <- q.doAsync(u.access, "com.atproto.server.createAppPassword", map[string]any{"name": "queued"})
	}()
	require.Eventually(t, func() bool { return q.slots.Stats().QueueLen == before+1 }, time.Minute, time.Millisecond)
	release()
	for _, w := range waits {
		(<-w).ok(t)
	}
	require.NotEmpty(t, (<-appPass).ok(t).str(t, "password"))
}

// TestSignUpBurstWithPoolSharingPLC: a burst of sign-ups, three times as
// many as the database pool has connections, all succeed against a PLC
// directory that stores its operations through the same pool (the
// development PLC): the transactions that wait for the directory hold at
// most a quarter of the pool, so the directory always has a connection.
func TestSignUpBurstWithPoolSharingPLC(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	e := newAccountEnv(t, envOptions{pool: pool, plcHandler: plctest.NewDirectory(plctest.NewPostgresStore(pool))})
	n := 3 * int(pool.Config().MaxConns)
	var waits []<-chan xrpcResult
	for i := range n {
		waits = append(waits, e.postAsync("", "com.atproto.server.createAccount", map[string]any{
			"handle": fmt.Sprintf("signup%d-%d.test", i, userSeq.Add(1)), "email": fmt.Sprintf("signup%d-%d@example.com", i, userSeq.Add(1)), "password": "correct horse battery",
		}))
	}
	for _, w := range waits {
		(<-w).ok(t)
	}
}
