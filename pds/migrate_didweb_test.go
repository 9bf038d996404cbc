package pds

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/stretchr/testify/require"
)

// TestDIDWebMoveThereAndBack: a did:web account comes to a (its holder
// signs the createAccount token with its own key, then points its
// did.json at a and activates), fills its repository (300 records, three
// blobs, preferences), moves to b with goat's calls through atclient and
// back to a. goat's identity step cannot apply (a did:web has no PLC
// operation: the old server's signPlcOperation names that): the holder
// edits did.json with the new server's recommended credentials instead.
// After each leg (requireWebMoved): the document names the new server
// and its key, the repository verifies with that key and holds what the
// old one held, the new account is active with a valid DID, the old one
// deactivated and recorded as moved away, the firehoses announce it, and a
// write follows on the imported commit.
func TestDIDWebMoveThereAndBack(t *testing.T) {
	t.Parallel()
	w := newWebWorld(t)
	p := newWebMovePair(t, w)
	id := w.identity(t, "alice.example.com")
	u := w.createWebAccount(t, p.a.accountEnv, id, "alice password")
	blobs := writeMoveAccount(t, p.a.accountEnv, u)
	start := copyOf(t, p.a.accountEnv, u)
	require.Equal(t, moveRecords, start.count)
	require.Equal(t, blobs, start.blobs)

	there := runWebMoveLeg(t, p, w, id, moveLeg{from: p.a, to: p.b, old: u, handle: id.handle, password: "new server password"})
	require.Equal(t, start, there.before)
	require.Equal(t, int64(moveRecords), there.status.IndexedRecords)

	// And back: a's account, recorded as moved away, is replaced.
	back := runWebMoveLeg(t, p, w, id, moveLeg{from: p.b, to: p.a, old: there.user, handle: id.handle, password: "back home password"})
	require.Equal(t, int64(moveRecords+1), back.status.IndexedRecords)
	require.Equal(t, start.blobs, back.before.blobs)
	require.Equal(t, start.prefs, back.before.prefs)
	p.a.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, 400, "InvalidToken")
}

// runWebMoveLeg moves the did:web account id from leg.from to leg.to with
// goat's calls, its identity step the holder's edit of did.json, and
// checks the result.
func runWebMoveLeg(t *testing.T, p *movePair, w *webWorld, id *webIdentity, leg moveLeg) *movedAccount {
	t.Helper()
	ctx := context.Background()
	before := copyOf(t, leg.from.accountEnv, leg.old)
	old, err := atclient.LoginWithPasswordHost(ctx, leg.from.url, id.did.String(), leg.old.pass, "", nil)
	require.NoError(t, err)
	status, err := moveSteps(ctx, old, goatMoveInput{
		NewHost: leg.to.url, NewHandle: leg.handle, NewPassword: leg.password, NewEmail: "moved-" + leg.to.name + "@example.com",
	}, func(ctx context.Context, old, newClient *atclient.APIClient) error {
		creds, err := agnostic.IdentityGetRecommendedDidCredentials(ctx, newClient)
		if err != nil {
			return err
		}
		var in agnostic.IdentitySignPlcOperation_Input
		if err := json.Unmarshal(*creds, &in); err != nil {
			return err
		}
		code := "not-needed"
		in.Token = &code
		_, err = agnostic.IdentitySignPlcOperation(ctx, old, &in)
		var apiErr *atclient.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Name != "InvalidRequest" {
			t.Errorf("signPlcOperation for a did:web: %v", err)
		}
		var rec struct {
			VerificationMethods map[string]string `json:"verificationMethods"`
			Services            map[string]struct {
				Endpoint string `json:"endpoint"`
			} `json:"services"`
		}
		if err := json.Unmarshal(*creds, &rec); err != nil {
			return err
		}
		key, svc := rec.VerificationMethods["atproto"], rec.Services["atproto_pds"]
		w.publish(t, id.host, didDoc(id.did, id.handle, svc.Endpoint, key))
		return nil
	})
	require.NoError(t, err)
	require.False(t, status.Activated)
	require.False(t, status.ValidDid, "checked before the document moved")
	require.Equal(t, int64(moveBlobs), status.ImportedBlobs)
	require.Equal(t, int64(before.count), status.IndexedRecords)

	res := leg.to.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": leg.handle, "password": leg.password}).ok(t)
	moved := &movedAccount{before: before, status: status, user: &user{
		did: id.did, handle: leg.handle, pass: leg.password, access: res.str(t, "accessJwt"), refresh: res.str(t, "refreshJwt"),
	}}
	requireWebMoved(t, p, leg, moved)
	return moved
}

// requireWebMoved checks a finished did:web leg.
func requireWebMoved(t *testing.T, p *movePair, leg moveLeg, moved *movedAccount) {
	t.Helper()
	ctx := context.Background()
	did := moved.user.did
	key, err := leg.to.accounts.PublicKey(ctx, did)
	require.NoError(t, err)
	ident, err := p.dir.LookupDID(ctx, did)
	require.NoError(t, err)
	require.Equal(t, leg.to.cfg.PublicURL(), ident.PDSEndpoint())
	pub, err := ident.PublicKey()
	require.NoError(t, err)
	require.Equal(t, key.DIDKey(), pub.DIDKey())

	commit := requireRepoVerifies(t, p, leg.to.accountEnv, did)
	require.Equal(t, moved.status.RepoRev, commit.Rev)
	require.Equal(t, moved.before.data, commit.Data, "MST root of the old repository")
	require.Equal(t, moved.before, copyOf(t, leg.to.accountEnv, moved.user))
	newClient, err := atclient.LoginWithPasswordHost(ctx, leg.to.url, did.String(), leg.password, "", nil)
	require.NoError(t, err)
	st, err := comatproto.ServerCheckAccountStatus(ctx, newClient)
	require.NoError(t, err)
	require.True(t, st.Activated)
	require.True(t, st.ValidDid)

	// The old account: deactivated, and recorded as moved away, since its
	// document named the new server when it was deactivated.
	q := url.Values{"did": {did.String()}}
	old := leg.from.get(t, "com.atproto.sync.getRepoStatus", "", q).ok(t).json(t)
	require.Equal(t, false, old["active"])
	require.Equal(t, "deactivated", old["status"])
	require.NotNil(t, leg.from.movedAwayAt(t, did))
	require.Nil(t, leg.to.movedAwayAt(t, did))

	// The new server announces the import (#sync), then activateAccount's
	// #identity, #account (active) and #sync; the old one the
	// deactivation.
	seen := leg.to.stream.until(t, did, activated)
	require.Equal(t, []string{"sync", "identity", "account(active)", "sync"}, eventKinds(seen))
	require.Equal(t, leg.handle, seen[1].handle)
	leg.from.stream.until(t, did, deactivated)
	requireWriteAfterMove(t, p, leg.to, newClient, did, commit.Rev)
}
