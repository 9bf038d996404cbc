package relaytest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestRelayFollowsMove runs indigo's relay in strict mode, subscribed to
// two Bulwark servers, while an account with records moves from a to b
// with goat's calls. The relay resolves DIDs in the servers' PLC
// directory, so it learns of the move from the DID document, as in
// production. Its output carries the account's events from a (creation,
// commits), then from b (the submission's #identity, activateAccount's
// #identity, #account and #sync) and b's commit after the move, which
// verifies with indigo and follows on the imported commit.
//
// Every event the servers sent is accounted for (the relay's received
// counters): all are relayed but two, which the relay refuses because
// the account is not hosted where they come from: b's #sync of the
// import, sent before the DID document names b, and a's #account
// (deactivated), sent after it stopped naming a. The test awaits each of
// those refusals before the next step, so that the outcome does not
// depend on which server's stream the relay reads first. Nothing else is
// dropped or complained about.
//
// The relay runs with its account host check on: the test harness turns
// it off, and then a's late #account (deactivated) would mark the
// account inactive at the relay and drop b's commits.
//
// Not parallel: the relay logs through slog.Default, which the test swaps
// for a recorder while it runs.
func TestRelayFollowsMove(t *testing.T) {
	logs := recordDefaultLog(t)
	ctx := context.Background()
	plcURL := startPLC(t)
	a, b := startBulwark(t, plcURL), startBulwark(t, plcURL)
	dir := &identity.BaseDirectory{PLCURL: plcURL, HTTPClient: *http.DefaultClient, SkipHandleVerification: true}
	relay := relaytesting.MustSimpleRelay(dir, t.TempDir(), false)
	relay.Relay.Config.SkipAccountHostCheck = false
	for _, s := range []*bulwark{a, b} {
		require.NoError(t, relay.Relay.SubscribeToHost(ctx, s.host, true, true))
		// Cleanups run last first: the relay lets go before the server
		// stops, so it does not redial.
		t.Cleanup(func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), s.host, false) })
	}
	require.Eventually(t, func() bool { return a.hub.Live() == 1 && b.hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)
	out := watchRelayEvents(t, relay.Port)

	old, did, want := createMover(t, a, 5)
	awaitRelayed(t, out, did, want)

	nc, err := moveData(ctx, old, b.url, "arrived.test", "new server password")
	require.NoError(t, err)
	awaitRefusal(t, logs, did, b, "sync")

	require.NoError(t, moveIdentity(ctx, old, nc, a.mailedPLCCode(t, old, did)))
	require.NoError(t, comatproto.ServerActivateAccount(ctx, nc))
	st, err := comatproto.ServerCheckAccountStatus(ctx, nc)
	require.NoError(t, err)
	require.True(t, st.Activated)
	want = append(want, "#identity", "#identity", "#account active", "#sync "+st.RepoRev)
	awaitRelayed(t, out, did, want)

	require.NoError(t, comatproto.ServerDeactivateAccount(ctx, old, &comatproto.ServerDeactivateAccount_Input{}))
	awaitRefusal(t, logs, did, a, "account")

	res, err := agnostic.RepoCreateRecord(ctx, nc, &agnostic.RepoCreateRecord_Input{Repo: did.String(), Collection: "app.bsky.feed.post", Record: postRecord("moved in")})
	require.NoError(t, err)
	want = append(want, "#commit "+res.Commit.Rev)
	awaitRelayed(t, out, did, want)

	requireRelayedMove(t, dir, out, did, st.RepoRev)
	// Sent: a 3 (creation) + 5 commits + 1 (deactivation); b 1 (import)
	// + 1 (submission) + 3 (activation) + 1 commit. Relayed: all of them
	// but the two refusals.
	require.Equal(t, map[string]float64{a.host: 9, b.host: 6}, relayCounter(t, "events_received_counter", a.host, b.host))
	require.Equal(t, 9+6-2, out.len())
	require.Empty(t, relayCounter(t, "events_warn_counter", a.host, b.host), "the relay's warnings")
	require.Equal(t, 2, logs.count("did="+did.String()), "the relay's complaints:\n%s", logs.String())

	acc, err := relay.Relay.GetAccount(ctx, did)
	require.NoError(t, err)
	host, err := relay.Relay.GetHost(ctx, b.host)
	require.NoError(t, err)
	require.Equal(t, host.ID, acc.HostID, "the relay has the account on b")
	require.True(t, acc.IsActive())
}

// createMover creates an account on s and writes n posts. It returns the
// account's client, its DID and the relay output the account should
// cause ("#kind rev").
func createMover(t *testing.T, s *bulwark, n int) (*atclient.APIClient, syntax.DID, []string) {
	t.Helper()
	ctx := context.Background()
	handle, email, password := "mover.test", "mover@example.com", "mover password"
	_, err := comatproto.ServerCreateAccount(ctx, atclient.NewAPIClient(s.url), &comatproto.ServerCreateAccount_Input{
		Handle: handle, Email: &email, Password: &password,
	})
	require.NoError(t, err)
	c := s.login(t, handle, password)
	did := *c.AccountDID
	head, err := comatproto.SyncGetLatestCommit(ctx, c, did.String())
	require.NoError(t, err)
	want := []string{"#identity", "#account active", "#sync " + head.Rev}
	for i := range n {
		res, err := agnostic.RepoCreateRecord(ctx, c, &agnostic.RepoCreateRecord_Input{Repo: did.String(), Collection: "app.bsky.feed.post", Record: postRecord(fmt.Sprint("post ", i))})
		require.NoError(t, err)
		want = append(want, "#commit "+res.Commit.Rev)
	}
	return c, did, want
}

func postRecord(text string) map[string]any {
	return map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"}
}

// forDID lists what the relay re-emitted about did, as "#kind rev"
// ("#account active" or "#account <status>").
func (o *relayedEvents) forDID(did syntax.DID) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, ev := range o.evs {
		switch {
		case ev.RepoCommit != nil && ev.RepoCommit.Repo == did.String():
			out = append(out, "#commit "+ev.RepoCommit.Rev)
		case ev.RepoSync != nil && ev.RepoSync.Did == did.String():
			out = append(out, "#sync "+ev.RepoSync.Rev)
		case ev.RepoIdentity != nil && ev.RepoIdentity.Did == did.String():
			out = append(out, "#identity")
		case ev.RepoAccount != nil && ev.RepoAccount.Did == did.String():
			status := "active"
			if !ev.RepoAccount.Active && ev.RepoAccount.Status != nil {
				status = *ev.RepoAccount.Status
			}
			out = append(out, "#account "+status)
		}
	}
	return out
}

// len is how many events the relay re-emitted.
func (o *relayedEvents) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.evs)
}

// awaitRelayed waits until the relay has re-emitted as many events about
// did as want holds, then requires them to be want.
func awaitRelayed(t *testing.T, out *relayedEvents, did syntax.DID, want []string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(out.forDID(did)) >= len(want) }, 30*time.Second, 10*time.Millisecond,
		"the relay re-emitted %q, awaiting %q", out.forDID(did), want)
	require.Equal(t, want, out.forDID(did))
}

// awaitRefusal waits until the relay has refused did's event of kind from
// s because the DID document names another host.
func awaitRefusal(t *testing.T, logs *logRecord, did syntax.DID, s *bulwark, kind string) {
	t.Helper()
	subs := []string{`msg="failed handling event"`, "did=" + did.String(), "host=" + s.host, "eventType=" + kind}
	require.Eventually(t, func() bool { return logs.count(subs...) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the relay did not refuse the #%s from %s; its log:\n%s", kind, s.host, logs.String())
	require.Equal(t, 1, logs.count(append(subs, "different host")...), "%s", logs.String())
}

// requireRelayedMove checks the relay's #sync from the new server and the
// #commit after it with indigo: the #sync is signed with the key of the
// DID document, the #commit inverts against the tree and follows on the
// imported commit.
func requireRelayedMove(t *testing.T, dir identity.Directory, out *relayedEvents, did syntax.DID, importedRev string) {
	t.Helper()
	ctx := context.Background()
	out.mu.Lock()
	evs := out.evs[len(out.evs)-2:]
	out.mu.Unlock()
	require.NotNil(t, evs[0].RepoSync)
	commit, err := atrepo.VerifySyncMessage(ctx, dir, evs[0].RepoSync)
	require.NoError(t, err)
	require.Equal(t, importedRev, commit.Rev)
	c := evs[1].RepoCommit
	require.NotNil(t, c)
	require.Equal(t, did.String(), c.Repo)
	_, err = atrepo.VerifyCommitMessage(ctx, c)
	require.NoError(t, err)
	require.NoError(t, atrepo.VerifyCommitSignature(ctx, dir, c))
	require.NotNil(t, c.Since)
	require.Equal(t, importedRev, *c.Since)
	require.Equal(t, commit.Data.String(), c.PrevData.String())
}

// relayCounter sums the relay's Prometheus counter name by its "pds"
// label, over the hosts given (other tests' relays count too).
func relayCounter(t *testing.T, name string, hosts ...string) map[string]float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pds" && slices.Contains(hosts, l.GetValue()) {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
