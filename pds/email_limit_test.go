package pds

import (
	"net/http"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/internal/testclock"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// newLimitedMailEnv is a mail server whose Mailer and Server share the
// default mailRecipient limit, as serve wires them; mail goes to sink
// when the test calls deliver.
func newLimitedMailEnv(t *testing.T, sink *emailtest.Server) *mailEnv {
	t.Helper()
	set, err := ratelimit.NewSet(map[string][]ratelimit.Rule{
		ratelimit.PolicyMailRecipient: ratelimit.DefaultPolicies()[ratelimit.PolicyMailRecipient],
	}, 0)
	require.NoError(t, err)
	clock := testclock.New(time.Now())
	logs := &lockedBuffer{}
	sc, err := email.ParseSMTPURL(sink.URL())
	require.NoError(t, err)
	cfg := &email.Config{From: "Bulwark <noreply@pds.test>", Now: clock.Now, SendTimeout: 10 * time.Second, SMTP: sc,
		RecipientLimit: set.Get(ratelimit.PolicyMailRecipient)}
	e := newAccountEnv(t, envOptions{mail: cfg, logs: logs, options: func(o *Options) { o.Limits = set }})
	return &mailEnv{accountEnv: e, clock: clock, logs: logs}
}

// TestMailFloodToOneAddress: sign-ups with a third party's address (under
// several spellings) and repeated confirmation requests deliver at most
// the per-address limit to that mailbox: past it a code request is 429
// RateLimitExceeded with Retry-After, a password reset is answered as
// usual but its mail dropped (logged), and the operator's sendEmail still
// goes. Another address is not affected.
func TestMailFloodToOneAddress(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newLimitedMailEnv(t, sink)
	signUp := func(addr string) *user {
		n := userSeq.Add(1)
		u := &user{handle: "flood" + itoa(int(n)) + ".test", pass: "correct horse battery"}
		res := e.post(t, "com.atproto.server.createAccount", "", map[string]any{"handle": u.handle, "email": addr, "password": u.pass}).ok(t)
		u.did, u.access = syntax.DID(res.str(t, "did")), res.str(t, "accessJwt")
		return u
	}

	// Each mail goes out before the next request (a later code would
	// cancel an earlier one's unsent mail).
	toVictim := 0
	deliver := func() {
		t.Helper()
		for range e.deliver(t) {
			if m := sink.Next(t); email.RecipientKey(m.To[0]) == "victim@example.com" {
				toVictim++
			}
		}
	}
	first := signUp("victim@example.com")
	for range ratelimit.DefaultPolicies()[ratelimit.PolicyMailRecipient][0].Limit {
		e.post(t, "com.atproto.server.requestEmailConfirmation", first.access, nil).ok(t)
		deliver()
	}
	refused := e.post(t, "com.atproto.server.requestEmailConfirmation", first.access, nil)
	msg := refused.fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	require.Contains(t, msg, ratelimit.PolicyMailRecipient)
	require.NotEmpty(t, refused.header.Get("Retry-After"))

	// The first account lets the address go; a second signs up with
	// another spelling of the same mailbox.
	e.post(t, "com.atproto.server.updateEmail", first.access, map[string]any{"email": "elsewhere@example.com"}).ok(t)
	second := signUp("Victim+2@Example.com")
	e.post(t, "com.atproto.server.requestEmailConfirmation", second.access, nil).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	e.post(t, "com.atproto.server.requestAccountDelete", second.access, nil).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	e.post(t, "com.atproto.identity.requestPlcOperationSignature", second.access, nil).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": "Victim+2@Example.com"}).ok(t)
	require.Contains(t, e.logs.String(), "password reset mail dropped")
	e.adminProc(t, "sendEmail", map[string]any{"recipientDid": second.did, "senderDid": "did:plc:moderator", "content": "From the operator."}).ok(t)
	deliver()
	limit := ratelimit.DefaultPolicies()[ratelimit.PolicyMailRecipient][0].Limit
	require.Equal(t, limit+1, toVictim, "the limit's codes and the operator's message")

	e.post(t, "com.atproto.server.requestEmailConfirmation", first.access, nil).ok(t)
	require.Equal(t, 1, e.deliver(t))
	require.Equal(t, []string{"elsewhere@example.com"}, sink.Next(t).To, "another address is not affected")
}
