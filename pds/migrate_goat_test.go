package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
)

// goatMoveInput is what goat's `account migrate` is given.
type goatMoveInput struct {
	NewHost, NewHandle, NewPassword, NewEmail, InviteCode string
	// PLCToken is the code requestPlcOperationSignature mailed.
	PLCToken string
}

// goatMove makes the calls goat's `account migrate` makes, in its order
// and through the client library it uses (indigo's atclient and the
// generated comatproto/agnostic functions), moving the account old is
// logged in to onto in.NewHost. It returns the new server's
// checkAccountStatus as it was before the identity moved.
func goatMove(ctx context.Context, old *atclient.APIClient, in goatMoveInput) (*comatproto.ServerCheckAccountStatus_Output, error) {
	return moveSteps(ctx, old, in, func(ctx context.Context, old, newClient *atclient.APIClient) error {
		return goatMoveIdentity(ctx, old, newClient, in.PLCToken)
	})
}

// moveSteps is goat's sequence with moveIdentity as its identity step
// (for a did:web, the holder edits its document instead).
func moveSteps(ctx context.Context, old *atclient.APIClient, in goatMoveInput, moveIdentity func(ctx context.Context, old, newClient *atclient.APIClient) error) (*comatproto.ServerCheckAccountStatus_Output, error) {
	did := *old.AccountDID
	newClient := atclient.NewAPIClient(in.NewHost)
	desc, err := comatproto.ServerDescribeServer(ctx, newClient)
	if err != nil {
		return nil, fmt.Errorf("describeServer: %w", err)
	}
	auth, err := comatproto.ServerGetServiceAuth(ctx, old, desc.Did, time.Now().Unix()+60, "com.atproto.server.createAccount")
	if err != nil {
		return nil, fmt.Errorf("getServiceAuth: %w", err)
	}
	didStr := did.String()
	create := comatproto.ServerCreateAccount_Input{Did: &didStr, Handle: in.NewHandle, Password: &in.NewPassword, Email: &in.NewEmail}
	if in.InviteCode != "" {
		create.InviteCode = &in.InviteCode
	}
	newClient.AccountDID = &did
	newClient.Auth = &atclient.PasswordAuth{Session: atclient.PasswordSessionData{AccountDID: did, AccessToken: auth.Token}}
	created, err := comatproto.ServerCreateAccount(ctx, newClient, &create)
	if err != nil {
		return nil, fmt.Errorf("createAccount: %w", err)
	}
	if created.Did != didStr {
		return nil, fmt.Errorf("createAccount made %s, not %s", created.Did, did)
	}
	sess, err := comatproto.ServerCreateSession(ctx, newClient, &comatproto.ServerCreateSession_Input{Identifier: didStr, Password: in.NewPassword})
	if err != nil {
		return nil, fmt.Errorf("createSession: %w", err)
	}
	newClient.Auth = &atclient.PasswordAuth{Session: atclient.PasswordSessionData{AccountDID: did, AccessToken: sess.AccessJwt, RefreshToken: sess.RefreshJwt}}
	if err := goatCopyData(ctx, old, newClient, did); err != nil {
		return nil, err
	}
	status, err := comatproto.ServerCheckAccountStatus(ctx, newClient)
	if err != nil {
		return nil, fmt.Errorf("checkAccountStatus: %w", err)
	}
	if err := moveIdentity(ctx, old, newClient); err != nil {
		return nil, err
	}
	if err := comatproto.ServerActivateAccount(ctx, newClient); err != nil {
		return nil, fmt.Errorf("activateAccount: %w", err)
	}
	if err := comatproto.ServerDeactivateAccount(ctx, old, &comatproto.ServerDeactivateAccount_Input{}); err != nil {
		return nil, fmt.Errorf("deactivateAccount: %w", err)
	}
	return status, nil
}

// goatCopyData is goat's data step: the repository, the preferences, and
// the blobs in pages of 100.
func goatCopyData(ctx context.Context, old, newClient *atclient.APIClient, did syntax.DID) error {
	car, err := comatproto.SyncGetRepo(ctx, old, did.String(), "")
	if err != nil {
		return fmt.Errorf("getRepo: %w", err)
	}
	if err := comatproto.RepoImportRepo(ctx, newClient, bytes.NewReader(car)); err != nil {
		return fmt.Errorf("importRepo: %w", err)
	}
	prefs, err := agnostic.ActorGetPreferences(ctx, old)
	if err != nil {
		return fmt.Errorf("getPreferences: %w", err)
	}
	if err := agnostic.ActorPutPreferences(ctx, newClient, &agnostic.ActorPutPreferences_Input{Preferences: prefs.Preferences}); err != nil {
		return fmt.Errorf("putPreferences: %w", err)
	}
	cursor := ""
	for {
		page, err := comatproto.SyncListBlobs(ctx, old, cursor, did.String(), 100, "")
		if err != nil {
			return fmt.Errorf("listBlobs: %w", err)
		}
		for _, c := range page.Cids {
			data, err := comatproto.SyncGetBlob(ctx, old, c, did.String())
			if err != nil {
				return fmt.Errorf("getBlob %s: %w", c, err)
			}
			if _, err := comatproto.RepoUploadBlob(ctx, newClient, bytes.NewReader(data)); err != nil {
				return fmt.Errorf("uploadBlob %s: %w", c, err)
			}
		}
		if page.Cursor == nil || *page.Cursor == "" {
			return nil
		}
		cursor = *page.Cursor
	}
}

// goatMoveIdentity is goat's identity step: the new server's recommended
// credentials, signed by the old server with the mailed code, submitted
// to the new one.
func goatMoveIdentity(ctx context.Context, old, newClient *atclient.APIClient, token string) error {
	creds, err := agnostic.IdentityGetRecommendedDidCredentials(ctx, newClient)
	if err != nil {
		return fmt.Errorf("getRecommendedDidCredentials: %w", err)
	}
	var unsigned agnostic.IdentitySignPlcOperation_Input
	if err := json.Unmarshal(*creds, &unsigned); err != nil {
		return fmt.Errorf("recommended credentials: %w", err)
	}
	unsigned.Token = &token
	signed, err := agnostic.IdentitySignPlcOperation(ctx, old, &unsigned)
	if err != nil {
		return fmt.Errorf("signPlcOperation: %w", err)
	}
	if err := agnostic.IdentitySubmitPlcOperation(ctx, newClient, &agnostic.IdentitySubmitPlcOperation_Input{Operation: signed.Operation}); err != nil {
		return fmt.Errorf("submitPlcOperation: %w", err)
	}
	return nil
}

// TestGoatMoveThereAndBack moves an account holding 300 records in four
// collections, three blobs that records refer to and preferences from a
// to b and back to a, with goat's calls in goat's order. After each move
// (requireMoved): the DID document names the new server, its signing key
// and its rotation key; the new repository verifies with indigo and holds
// every record (same CIDs, same MST root), blob and preference of the
// old, none missing; the old account is deactivated and still serves its
// repository to its owner; the firehoses announce the move; and a write
// on the new server makes a #commit that follows on the imported commit.
func TestGoatMoveThereAndBack(t *testing.T) {
	t.Parallel()
	p := newMovePair(t)
	u := p.a.createUser(t)
	blobs := writeMoveAccount(t, p.a.accountEnv, u)
	start := copyOf(t, p.a.accountEnv, u)
	require.Equal(t, moveRecords, start.count)
	require.Len(t, start.records, 4)
	require.Equal(t, blobs, start.blobs)
	require.Len(t, start.prefs, len(movePrefs)+1, "the preferences and the derived declaredAgePref")

	there := runMoveLeg(t, p, moveLeg{
		from: p.a, to: p.b, old: u,
		handle: "there" + itoa(int(userSeq.Add(1))) + ".test", password: "new server password",
	})
	require.Equal(t, start, there.before)
	require.Equal(t, int64(moveRecords), there.status.IndexedRecords)

	// And back: a's deactivated account is replaced by a new one, which
	// gets what b holds now (the write made there as well).
	back := runMoveLeg(t, p, moveLeg{
		from: p.b, to: p.a, old: there.user,
		handle: u.handle, password: "back home password",
	})
	require.Equal(t, int64(moveRecords+1), back.status.IndexedRecords)
	require.Equal(t, start.blobs, back.before.blobs)
	require.Equal(t, start.prefs, back.before.prefs)
	p.a.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, 400, "InvalidToken")
}

// moveLeg is one move of an account: from one server of a movePair to the
// other.
type moveLeg struct {
	from, to *moveServer
	// old is the account's session on from.
	old *user
	// handle and password are the account's on to.
	handle, password string
}

// movedAccount is how a leg went.
type movedAccount struct {
	// user is the account's session on the new server.
	user *user
	// before is what the old server held before the move.
	before *accountCopy
	// status is the new server's checkAccountStatus before the identity
	// moved.
	status *comatproto.ServerCheckAccountStatus_Output
}

// runMoveLeg requests the PLC code on the old server and reads it as the
// operator does (the servers hold their mail), runs goat's move, and
// checks the result (requireMoved).
func runMoveLeg(t *testing.T, p *movePair, leg moveLeg) *movedAccount {
	t.Helper()
	ctx := context.Background()
	did := leg.old.did
	before := copyOf(t, leg.from.accountEnv, leg.old)
	old, err := atclient.LoginWithPasswordHost(ctx, leg.from.url, did.String(), leg.old.pass, "", nil)
	require.NoError(t, err)
	require.NoError(t, comatproto.IdentityRequestPlcOperationSignature(ctx, old))
	token := leg.from.mailedCode(t, did, email.PurposePLCOperation)

	status, err := goatMove(ctx, old, goatMoveInput{
		NewHost: leg.to.url, NewHandle: leg.handle, NewPassword: leg.password,
		NewEmail: "moved-" + leg.handle + "@example.com", PLCToken: token,
	})
	require.NoError(t, err)
	require.False(t, status.Activated)
	require.False(t, status.ValidDid, "checked before the identity moved")
	require.Equal(t, int64(moveBlobs), status.ExpectedBlobs)
	require.Equal(t, int64(moveBlobs), status.ImportedBlobs)
	require.Equal(t, int64(before.count), status.IndexedRecords)
	require.NotEmpty(t, status.RepoCommit)

	res := leg.to.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": leg.handle, "password": leg.password}).ok(t)
	moved := &movedAccount{before: before, status: status, user: &user{
		did: did, handle: leg.handle, pass: leg.password, access: res.str(t, "accessJwt"), refresh: res.str(t, "refreshJwt"),
	}}
	requireMoved(t, p, leg, moved)
	return moved
}

// mailedCode is the code of purpose last mailed to did, read as the
// operator reads held mail: the admin method getPendingEmailTokens.
func (e *accountEnv) mailedCode(t *testing.T, did syntax.DID, purpose email.Purpose) string {
	t.Helper()
	res := e.adminGet(t, "getPendingEmailTokens", url.Values{"account": {did.String()}}).ok(t).json(t)
	require.Equal(t, false, res["mailEnabled"])
	code := ""
	for _, tok := range res["tokens"].([]any) {
		if m := tok.(map[string]any); m["purpose"] == string(purpose) {
			code, _ = m["code"].(string)
		}
	}
	require.NotEmpty(t, code, "no %s code held for %s", purpose, did)
	return code
}
