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
)

// goatMoveInput is what goat's `account migrate` is given.
type goatMoveInput struct {
	NewHost, NewHandle, NewPassword, NewEmail, InviteCode string
	// PLCToken is the code requestPlcOperationSignature mailed.
	PLCToken string
	// ImportRepo copies the repository (old sync.getRepo, new
	// repo.importRepo). Without it the new repository stays empty.
	ImportRepo bool
}

// goatMove makes the calls goat's `account migrate` makes, in its order
// and through the client library it uses (indigo's atclient and the
// generated comatproto/agnostic functions), moving the account old is
// logged in to onto in.NewHost. It returns the new server's
// checkAccountStatus as it was before the identity moved.
func goatMove(ctx context.Context, old *atclient.APIClient, in goatMoveInput) (*comatproto.ServerCheckAccountStatus_Output, error) {
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
	if err := goatCopyData(ctx, old, newClient, did, in.ImportRepo); err != nil {
		return nil, err
	}
	status, err := comatproto.ServerCheckAccountStatus(ctx, newClient)
	if err != nil {
		return nil, fmt.Errorf("checkAccountStatus: %w", err)
	}
	if err := goatMoveIdentity(ctx, old, newClient, in.PLCToken); err != nil {
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

// goatCopyData is goat's data step: the repository (when importRepo),
// the preferences, and the blobs in pages of 100.
func goatCopyData(ctx context.Context, old, newClient *atclient.APIClient, did syntax.DID, importRepo bool) error {
	if importRepo {
		car, err := comatproto.SyncGetRepo(ctx, old, did.String(), "")
		if err != nil {
			return fmt.Errorf("getRepo: %w", err)
		}
		if err := comatproto.RepoImportRepo(ctx, newClient, bytes.NewReader(car)); err != nil {
			return fmt.Errorf("importRepo: %w", err)
		}
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

// TestGoatMoveThereAndBack moves an account from a to b and back to a
// with goat's call sequence. The repository itself is not copied here
// (ImportRepo false): the preferences, the identity and the account
// states are. Setting ImportRepo, once importRepo exists, makes this the
// full A→B→A move.
func TestGoatMoveThereAndBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newMigrationPair(t, envOptions{})
	u := p.a.createUser(t)
	prefs := []any{
		map[string]any{"$type": "app.bsky.actor.defs#adultContentPref", "enabled": true},
		map[string]any{"$type": "app.bsky.actor.defs#personalDetailsPref", "birthDate": "1990-05-01T00:00:00.000Z"},
	}
	p.a.post(t, nsidPutPrefs, u.access, map[string]any{"preferences": prefs}).ok(t)

	oldClient, err := atclient.LoginWithPasswordHost(ctx, p.a.url, u.did.String(), u.pass, "", nil)
	require.NoError(t, err)
	status, err := goatMove(ctx, oldClient, goatMoveInput{
		NewHost: p.b.url, NewHandle: "there" + itoa(int(userSeq.Add(1))) + ".test", NewPassword: "new server password",
		NewEmail: "there@example.com", PLCToken: p.a.plcToken(t, u.did),
	})
	require.NoError(t, err)
	require.False(t, status.Activated)
	require.False(t, status.ValidDid)
	requireHostedOn(t, p, p.b, p.a, u.did)

	bClient, err := atclient.LoginWithPasswordHost(ctx, p.b.url, u.did.String(), "new server password", "", nil)
	require.NoError(t, err)
	got, err := agnostic.ActorGetPreferences(ctx, bClient)
	require.NoError(t, err)
	require.Len(t, got.Preferences, 3, "the two preferences and the derived declaredAgePref")

	// And back: a's deactivated account is replaced by a new one.
	_, err = goatMove(ctx, bClient, goatMoveInput{
		NewHost: p.a.url, NewHandle: u.handle, NewPassword: "back home password",
		NewEmail: "user-back@example.com", PLCToken: p.b.plcToken(t, u.did),
	})
	require.NoError(t, err)
	requireHostedOn(t, p, p.a, p.b, u.did)
	p.a.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, 400, "InvalidToken")
	back, err := atclient.LoginWithPasswordHost(ctx, p.a.url, u.handle, "back home password", "", nil)
	require.NoError(t, err)
	got, err = agnostic.ActorGetPreferences(ctx, back)
	require.NoError(t, err)
	require.Len(t, got.Preferences, 3)
}

// requireHostedOn checks that did's DID document names on with its key,
// that its account there is active and served, and that off's is
// deactivated.
func requireHostedOn(t *testing.T, p *migrationPair, on, off *accountEnv, did syntax.DID) {
	t.Helper()
	key, err := on.accounts.PublicKey(context.Background(), did)
	require.NoError(t, err)
	last := p.lastOp(t, did)
	require.Equal(t, on.cfg.PublicURL(), last.Services["atproto_pds"].Endpoint)
	require.Equal(t, key.DIDKey(), last.VerificationMethods["atproto"])
	require.Equal(t, []string{on.accounts.RotationKey()}, last.RotationKeys)
	q := url.Values{"did": {did.String()}}
	st := on.get(t, "com.atproto.sync.getRepoStatus", "", q).ok(t).json(t)
	require.Equal(t, true, st["active"])
	st = off.get(t, "com.atproto.sync.getRepoStatus", "", q).ok(t).json(t)
	require.Equal(t, false, st["active"])
	require.Equal(t, "deactivated", st["status"])
}
