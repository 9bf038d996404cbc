package pds

import (
	"context"
	"net/url"
	"testing"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"
)

// requireMoved checks a finished leg: identity, data, the old account,
// the firehoses, and a write on the new server.
func requireMoved(t *testing.T, p *movePair, leg moveLeg, moved *movedAccount) {
	t.Helper()
	ctx := context.Background()
	did := moved.user.did
	requireIdentityOn(t, p, leg.to, did)

	// The repository verifies and is the old one under a new commit: same
	// records, same MST root, the blobs and the preferences.
	commit := requireRepoVerifies(t, p, leg.to.accountEnv, did)
	require.Equal(t, moved.status.RepoRev, commit.Rev)
	require.Equal(t, moved.before.data, commit.Data, "MST root of the old repository")
	after := copyOf(t, leg.to.accountEnv, moved.user)
	require.Equal(t, moved.before, after)
	newClient, err := atclient.LoginWithPasswordHost(ctx, leg.to.url, did.String(), leg.password, "", nil)
	require.NoError(t, err)
	missing, err := comatproto.RepoListMissingBlobs(ctx, newClient, "", 1000)
	require.NoError(t, err)
	require.Empty(t, missing.Blobs)
	st, err := comatproto.ServerCheckAccountStatus(ctx, newClient)
	require.NoError(t, err)
	require.True(t, st.Activated)
	require.True(t, st.ValidDid)

	// The old account is deactivated, and serves its repository to its
	// owner only.
	q := url.Values{"did": {did.String()}}
	old := leg.from.get(t, "com.atproto.sync.getRepoStatus", "", q).ok(t).json(t)
	require.Equal(t, false, old["active"])
	require.Equal(t, "deactivated", old["status"])
	leg.from.get(t, "com.atproto.sync.getRepo", "", q).fails(t, 400, "RepoDeactivated")
	oldClient, err := atclient.LoginWithPasswordHost(ctx, leg.from.url, did.String(), leg.old.pass, "", nil)
	require.NoError(t, err)
	car, err := comatproto.SyncGetRepo(ctx, oldClient, did.String(), "")
	require.NoError(t, err)
	require.NotEmpty(t, car)

	requireMoveAnnounced(t, p, leg, did, commit)
	requireWriteAfterMove(t, p, leg.to, newClient, did, commit.Rev)
}

// requireIdentityOn checks that did's DID document, as the PLC directory
// serves it, names on: its URL, the account's signing key there and the
// server's rotation key, with the last operation carrying the same.
func requireIdentityOn(t *testing.T, p *movePair, on *moveServer, did syntax.DID) {
	t.Helper()
	ctx := context.Background()
	key, err := on.accounts.PublicKey(ctx, did)
	require.NoError(t, err)
	ident, err := p.dir.LookupDID(ctx, did)
	require.NoError(t, err)
	require.Equal(t, on.cfg.PublicURL(), ident.PDSEndpoint())
	pub, err := ident.PublicKey()
	require.NoError(t, err)
	require.Equal(t, key.DIDKey(), pub.DIDKey())
	last := p.lastOp(t, did)
	require.Equal(t, on.cfg.PublicURL(), last.Services["atproto_pds"].Endpoint)
	require.Equal(t, key.DIDKey(), last.VerificationMethods["atproto"])
	require.Equal(t, []string{on.accounts.RotationKey()}, last.RotationKeys)
	st := on.get(t, "com.atproto.sync.getRepoStatus", "", url.Values{"did": {did.String()}}).ok(t).json(t)
	require.Equal(t, true, st["active"])
}

// lastOp is the PLC directory's current operation of did.
func (p *movePair) lastOp(t *testing.T, did syntax.DID) *didplc.RegularOp {
	t.Helper()
	return (&migrationPair{plc: p.plc}).lastOp(t, did)
}

// requireMoveAnnounced reads both firehoses. The new server's carries,
// for did, the import's #sync and the submission's #identity, then
// activateAccount's #identity, #account (active) and #sync of the
// imported commit, in that order, each #sync verifying against the DID
// document. The old server's then carries #account (deactivated).
func requireMoveAnnounced(t *testing.T, p *movePair, leg moveLeg, did syntax.DID, commit *atrepo.Commit) {
	t.Helper()
	ctx := context.Background()
	seen := leg.to.stream.until(t, did, activated)
	require.Equal(t, []string{"sync", "identity", "identity", "account(active)", "sync"}, eventKinds(seen))
	for i := 1; i < len(seen); i++ {
		require.Less(t, seen[i-1].seq, seen[i].seq)
	}
	require.Equal(t, leg.handle, seen[1].handle)
	require.Equal(t, leg.handle, seen[2].handle)
	for _, s := range []moveEvent{seen[0], seen[4]} {
		require.Equal(t, commit.Rev, s.rev)
		got, err := atrepo.VerifySyncMessage(ctx, p.dir, s.sync)
		require.NoError(t, err)
		require.Equal(t, commit.Data, got.Data)
	}

	leg.from.stream.until(t, did, deactivated)
}

// requireWriteAfterMove writes on the new server: its #commit verifies
// with indigo (inverts against the imported tree, signed with the key of
// the DID document) and follows on the imported commit (since).
func requireWriteAfterMove(t *testing.T, p *movePair, on *moveServer, c *atclient.APIClient, did syntax.DID, importedRev string) {
	t.Helper()
	ctx := context.Background()
	out, err := agnostic.RepoCreateRecord(ctx, c, &agnostic.RepoCreateRecord_Input{
		Repo: did.String(), Collection: "app.bsky.feed.post", Record: post("written after the move to " + on.name),
	})
	require.NoError(t, err)
	seen := on.stream.until(t, did, committed)
	require.Len(t, seen, 1, "%s", eventKinds(seen))
	msg := seen[0].commit
	require.NoError(t, verifyCommitWithPLC(ctx, p.dir, msg))
	require.NotNil(t, msg.Since)
	require.Equal(t, importedRev, *msg.Since)
	require.Equal(t, out.Commit.Rev, msg.Rev)
	require.Len(t, msg.Ops, 1)
	require.Equal(t, out.Cid, msg.Ops[0].Cid.String())
}
