package pds

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/blob"
)

// TestAdminGoatClient makes the calls goat's `pds admin` commands make,
// through the client library goat uses (indigo's atclient admin client and
// the generated comatproto functions), so a response goat cannot decode
// fails here.
func TestAdminGoatClient(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{options: func(o *Options) {
		store, err := blob.NewDiskStore(o.Config.BlobDir)
		require.NoError(t, err)
		o.Blobs = blob.New(o.DB, store, blob.Config{})
	}})
	ctx := context.Background()
	u := e.createUser(t)
	client := atclient.NewAdminClient(e.url, testAdminPassword)

	// goat pds admin create-invites; account create (an invite, then createAccount).
	code, err := comatproto.ServerCreateInviteCode(ctx, client, &comatproto.ServerCreateInviteCode_Input{UseCount: 1})
	require.NoError(t, err)
	require.NotEmpty(t, code.Code)

	goatAccountTakedown(t, ctx, client, u)
	sessionJWT := goatAccountUpdate(t, ctx, client, e, u)
	blobCID := goatBlobPurge(t, ctx, client, e, u, sessionJWT)

	// The invite methods goat does not call, through the same client.
	codes, err := comatproto.AdminGetInviteCodes(ctx, client, "", 0, "")
	require.NoError(t, err)
	require.Len(t, codes.Codes, 1)
	require.NoError(t, comatproto.AdminDisableInviteCodes(ctx, client, &comatproto.AdminDisableInviteCodes_Input{Codes: []string{code.Code}}))
	require.NoError(t, comatproto.AdminDisableAccountInvites(ctx, client, &comatproto.AdminDisableAccountInvites_Input{Account: u.did.String()}))
	require.NoError(t, comatproto.AdminEnableAccountInvites(ctx, client, &comatproto.AdminEnableAccountInvites_Input{Account: u.did.String()}))

	// A wrong password is a 401 the client reports as such.
	_, err = comatproto.AdminGetAccountInfo(ctx, atclient.NewAdminClient(e.url, "wrong"), u.did.String())
	var apiErr *atclient.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusUnauthorized, apiErr.StatusCode)

	// goat pds admin account delete.
	require.NoError(t, comatproto.AdminDeleteAccount(ctx, client, &comatproto.AdminDeleteAccount_Input{Did: u.did.String()}))
	_, err = comatproto.AdminGetAccountInfo(ctx, client, u.did.String())
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "NotFound", apiErr.Name)

	require.Equal(t, []string{
		"com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus",
		"com.atproto.admin.updateAccountEmail", "com.atproto.admin.updateAccountHandle", "com.atproto.admin.updateAccountPassword",
		"com.atproto.admin.disableAccountInvites", "com.atproto.admin.enableAccountInvites", "com.atproto.admin.deleteAccount",
	}, auditActions(t, e.pool, u.did.String()))
	require.Len(t, auditActions(t, e.pool, u.did.String()+"/blob/"+blobCID), 2)
	require.Equal(t, []string{"com.atproto.server.createInviteCode", "com.atproto.admin.disableInviteCodes"}, auditActions(t, e.pool, "invite_codes"))
}

// goatAccountTakedown: goat pds admin account info / takedown / list /
// takedown --reverse.
func goatAccountTakedown(t *testing.T, ctx context.Context, client *atclient.APIClient, u *user) {
	t.Helper()
	info, err := comatproto.AdminGetAccountInfo(ctx, client, u.did.String())
	require.NoError(t, err)
	require.Equal(t, u.handle, info.Handle)
	_, err = comatproto.AdminUpdateSubjectStatus(ctx, client, &comatproto.AdminUpdateSubjectStatus_Input{
		Subject: &comatproto.AdminUpdateSubjectStatus_Input_Subject{AdminDefs_RepoRef: &comatproto.AdminDefs_RepoRef{
			LexiconTypeID: "com.atproto.admin.defs#repoRef", Did: u.did.String(),
		}},
		Takedown: &comatproto.AdminDefs_StatusAttr{Applied: true},
	})
	require.NoError(t, err)
	repos, err := comatproto.SyncListRepos(ctx, client, "", 500)
	require.NoError(t, err)
	require.Len(t, repos.Repos, 1)
	require.False(t, *repos.Repos[0].Active)
	require.Equal(t, "takendown", *repos.Repos[0].Status)
	_, err = comatproto.AdminUpdateSubjectStatus(ctx, client, &comatproto.AdminUpdateSubjectStatus_Input{
		Subject: &comatproto.AdminUpdateSubjectStatus_Input_Subject{AdminDefs_RepoRef: &comatproto.AdminDefs_RepoRef{
			LexiconTypeID: "com.atproto.admin.defs#repoRef", Did: u.did.String(),
		}},
		Takedown: &comatproto.AdminDefs_StatusAttr{Applied: false},
	})
	require.NoError(t, err)
	status, err := comatproto.AdminGetSubjectStatus(ctx, client, "", u.did.String(), "")
	require.NoError(t, err)
	require.False(t, status.Takedown.Applied)
}

// goatAccountUpdate: goat pds admin account update --email --handle;
// reset-password. It returns an access token made with the new password.
func goatAccountUpdate(t *testing.T, ctx context.Context, client *atclient.APIClient, e *accountEnv, u *user) string {
	t.Helper()
	require.NoError(t, comatproto.AdminUpdateAccountEmail(ctx, client, &comatproto.AdminUpdateAccountEmail_Input{Account: u.did.String(), Email: "goat@example.com"}))
	handle := "goat" + itoa(int(userSeq.Add(1))) + ".test"
	require.NoError(t, comatproto.AdminUpdateAccountHandle(ctx, client, &comatproto.AdminUpdateAccountHandle_Input{Did: u.did.String(), Handle: handle}))
	password := rand.Text()
	require.NoError(t, comatproto.AdminUpdateAccountPassword(ctx, client, &comatproto.AdminUpdateAccountPassword_Input{Did: u.did.String(), Password: password}))
	sess := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": handle, "password": password}).ok(t)
	infos, err := comatproto.AdminGetAccountInfos(ctx, client, []string{u.did.String()})
	require.NoError(t, err)
	require.Len(t, infos.Infos, 1)
	require.Equal(t, handle, infos.Infos[0].Handle)
	require.Equal(t, "goat@example.com", *infos.Infos[0].Email)
	return sess.str(t, "accessJwt")
}

// goatBlobPurge: goat pds admin blob status / purge / purge --reverse, on a
// blob uploaded with access. It returns the blob's CID.
func goatBlobPurge(t *testing.T, ctx context.Context, client *atclient.APIClient, e *accountEnv, u *user, access string) string {
	t.Helper()
	res := e.do(t, http.MethodPost, "com.atproto.repo.uploadBlob", access, bytes.NewReader(pngData(t, 1000)), nil,
		http.Header{"Content-Type": {"image/png"}}).ok(t)
	var up struct {
		Blob struct {
			Ref struct {
				Link string `json:"$link"`
			} `json:"ref"`
		} `json:"blob"`
	}
	require.NoError(t, json.Unmarshal(res.body, &up))
	blobCID := up.Blob.Ref.Link
	status, err := comatproto.AdminGetSubjectStatus(ctx, client, blobCID, u.did.String(), "")
	require.NoError(t, err)
	require.Equal(t, blobCID, status.Subject.AdminDefs_RepoBlobRef.Cid)
	require.False(t, status.Takedown.Applied)
	for _, applied := range []bool{true, false} {
		_, err = comatproto.AdminUpdateSubjectStatus(ctx, client, &comatproto.AdminUpdateSubjectStatus_Input{
			Subject: &comatproto.AdminUpdateSubjectStatus_Input_Subject{AdminDefs_RepoBlobRef: &comatproto.AdminDefs_RepoBlobRef{
				LexiconTypeID: "com.atproto.admin.defs#repoBlobRef", Did: u.did.String(), Cid: blobCID,
			}},
			Takedown: &comatproto.AdminDefs_StatusAttr{Applied: applied},
		})
		require.NoError(t, err)
		status, err = comatproto.AdminGetSubjectStatus(ctx, client, blobCID, u.did.String(), "")
		require.NoError(t, err)
		require.Equal(t, applied, status.Takedown.Applied)
	}
	return blobCID
}
