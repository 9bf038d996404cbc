package pds

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
)

// accountReads are the reads of a user's repository and of one of its
// records that an account's takedown or deactivation refuses.
type accountReads struct {
	repo, record, syncRecord url.Values
}

// newAccountReads writes a record for u and checks that the reads serve it.
func newAccountReads(t *testing.T, e *accountEnv, u *user) accountReads {
	t.Helper()
	rec := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post("before the takedown"),
	}).ok(t)
	rkey := strings.TrimPrefix(rec.str(t, "uri"), "at://"+u.did.String()+"/app.bsky.feed.post/")
	r := accountReads{
		repo:       url.Values{"did": {u.did.String()}},
		record:     url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {rkey}},
		syncRecord: url.Values{"did": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {rkey}},
	}
	e.get(t, "com.atproto.sync.getRepo", "", r.repo).ok(t)
	e.get(t, "com.atproto.repo.getRecord", "", r.record).ok(t)
	return r
}

func TestAdminTakedownAccount(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	r := newAccountReads(t, e, u)

	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", r.repo).ok(t))
	require.NotNil(t, status.Subject.AdminDefs_RepoRef)
	require.Equal(t, u.did.String(), status.Subject.AdminDefs_RepoRef.Did)
	require.False(t, status.Takedown.Applied)
	require.False(t, status.Deactivated.Applied)

	in := takeDownAccount(t, e, u, r)
	reverseAccountTakedown(t, e, u, r, in)
	deactivateThroughAdmin(t, e, r, in)

	require.Equal(t, []string{
		"com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus",
		"com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus",
	}, auditActions(t, e.pool, u.did.String()))

	accountSubjectRefusals(t, e, u)
}

// takeDownAccount takes u's account down as goat does and checks what that
// refuses; it returns the request, to be varied.
func takeDownAccount(t *testing.T, e *accountEnv, u *user, r accountReads) *comatproto.AdminUpdateSubjectStatus_Input {
	t.Helper()
	ref := "ticket-1234"
	in := comatproto.AdminUpdateSubjectStatus_Input{
		Subject:  &comatproto.AdminUpdateSubjectStatus_Input_Subject{AdminDefs_RepoRef: &comatproto.AdminDefs_RepoRef{Did: u.did.String()}},
		Takedown: &comatproto.AdminDefs_StatusAttr{Applied: true, Ref: &ref},
	}
	res := e.adminProc(t, "updateSubjectStatus", &in).ok(t)
	require.Contains(t, string(res.body), `"$type":"com.atproto.admin.defs#repoRef"`)
	out := decodeAs[comatproto.AdminUpdateSubjectStatus_Output](t, res)
	require.Equal(t, u.did.String(), out.Subject.AdminDefs_RepoRef.Did)
	require.True(t, out.Takedown.Applied)
	require.Equal(t, ref, *out.Takedown.Ref)

	ev := lastAccountEvent(t, e.pool, u.did)
	require.False(t, ev.Active)
	require.NotNil(t, ev.Status)
	require.Equal(t, "takendown", *ev.Status)

	e.get(t, "com.atproto.sync.getRepo", "", r.repo).fails(t, http.StatusBadRequest, "RepoTakendown")
	e.get(t, "com.atproto.sync.getRecord", "", r.syncRecord).fails(t, http.StatusBadRequest, "RepoTakendown")
	e.get(t, "com.atproto.repo.getRecord", "", r.record).fails(t, http.StatusBadRequest, "RepoTakendown")
	e.get(t, "com.atproto.repo.listRecords", "", url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}}).
		fails(t, http.StatusBadRequest, "RepoTakendown")
	// The takedown ended the sessions; logging in again is refused.
	e.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).
		fails(t, http.StatusUnauthorized, "AccountTakedown")

	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", r.repo).ok(t))
	require.True(t, status.Takedown.Applied)
	require.Equal(t, ref, *status.Takedown.Ref)
	require.False(t, status.Deactivated.Applied)

	// A second takedown changes nothing (no second event).
	events := len(e.eventKinds(t, u.did))
	e.adminProc(t, "updateSubjectStatus", &in).ok(t)
	require.Len(t, e.eventKinds(t, u.did), events)

	return &in
}

// reverseAccountTakedown reverses in's takedown: both reads come back, with
// an #account event, but not the sessions the takedown ended.
func reverseAccountTakedown(t *testing.T, e *accountEnv, u *user, r accountReads, in *comatproto.AdminUpdateSubjectStatus_Input) {
	t.Helper()
	in.Takedown = &comatproto.AdminDefs_StatusAttr{Applied: false}
	out := decodeAs[comatproto.AdminUpdateSubjectStatus_Output](t, e.adminProc(t, "updateSubjectStatus", in).ok(t))
	require.False(t, out.Takedown.Applied)
	ev := lastAccountEvent(t, e.pool, u.did)
	require.True(t, ev.Active)
	require.Nil(t, ev.Status)
	e.get(t, "com.atproto.sync.getRepo", "", r.repo).ok(t)
	e.get(t, "com.atproto.sync.getRecord", "", r.syncRecord).ok(t)
	e.get(t, "com.atproto.repo.getRecord", "", r.record).ok(t)
	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", r.repo).ok(t))
	require.False(t, status.Takedown.Applied)
	require.Nil(t, status.Takedown.Ref)
	// Reversing the takedown does not revive the old sessions.
	e.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
}

// deactivateThroughAdmin deactivates an account through updateSubjectStatus;
// reversing a takedown of a deactivated account leaves it deactivated.
func deactivateThroughAdmin(t *testing.T, e *accountEnv, r accountReads, in *comatproto.AdminUpdateSubjectStatus_Input) {
	t.Helper()
	in.Takedown = nil
	in.Deactivated = &comatproto.AdminDefs_StatusAttr{Applied: true}
	e.adminProc(t, "updateSubjectStatus", in).ok(t)
	e.get(t, "com.atproto.sync.getRepo", "", r.repo).fails(t, http.StatusBadRequest, "RepoDeactivated")
	in.Deactivated = nil
	in.Takedown = &comatproto.AdminDefs_StatusAttr{Applied: false}
	e.adminProc(t, "updateSubjectStatus", in).ok(t)
	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", r.repo).ok(t))
	require.True(t, status.Deactivated.Applied)
	require.False(t, status.Takedown.Applied)
	in.Takedown, in.Deactivated = nil, &comatproto.AdminDefs_StatusAttr{Applied: false}
	e.adminProc(t, "updateSubjectStatus", in).ok(t)
	e.get(t, "com.atproto.sync.getRepo", "", r.repo).ok(t)
}

// accountSubjectRefusals: unknown accounts and malformed subjects are named
// 400s.
func accountSubjectRefusals(t *testing.T, e *accountEnv, u *user) {
	t.Helper()
	e.adminQuery(t, "getSubjectStatus", url.Values{"did": {"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}}).fails(t, http.StatusBadRequest, "NotFound")
	e.adminQuery(t, "getSubjectStatus", nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject": map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}, "takedown": map[string]any{"applied": true},
	}).fails(t, http.StatusBadRequest, "AccountNotFound")
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject": map[string]any{"did": u.did.String()}, "takedown": map[string]any{"applied": true},
	}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateSubjectStatus", map[string]any{"takedown": map[string]any{"applied": true}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateSubjectStatus", []byte(`{"subject": 7}`)).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject": map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": "nope"}, "takedown": map[string]any{"applied": true},
	}).fails(t, http.StatusBadRequest, "InvalidRequest")
}

func TestAdminTakedownRecord(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	var uris, cids []string
	for _, text := range []string{"one", "two"} {
		res := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
			"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post(text),
		}).ok(t)
		uris, cids = append(uris, res.str(t, "uri")), append(cids, res.str(t, "cid"))
	}
	rkey := uris[0][strings.LastIndex(uris[0], "/")+1:]
	recordQ := url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {rkey}}
	syncRecordQ := url.Values{"did": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {rkey}}
	listQ := url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}}
	listed := func() []string {
		var out listRecordsOutput
		require.NoError(t, json.Unmarshal(e.get(t, "com.atproto.repo.listRecords", "", listQ).ok(t).body, &out))
		var got []string
		for _, r := range out.Records {
			got = append(got, r.URI)
		}
		return got
	}
	require.ElementsMatch(t, uris, listed())

	uriQ := url.Values{"uri": {uris[0]}}
	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", uriQ).ok(t))
	require.NotNil(t, status.Subject.RepoStrongRef)
	require.Equal(t, uris[0], status.Subject.RepoStrongRef.Uri)
	require.Equal(t, cids[0], status.Subject.RepoStrongRef.Cid)
	require.False(t, status.Takedown.Applied)
	require.Nil(t, status.Deactivated)

	ref := "report-77"
	in := comatproto.AdminUpdateSubjectStatus_Input{
		Subject:  &comatproto.AdminUpdateSubjectStatus_Input_Subject{RepoStrongRef: &comatproto.RepoStrongRef{Uri: uris[0], Cid: cids[0]}},
		Takedown: &comatproto.AdminDefs_StatusAttr{Applied: true, Ref: &ref},
	}
	res := e.adminProc(t, "updateSubjectStatus", &in).ok(t)
	require.Contains(t, string(res.body), `"$type":"com.atproto.repo.strongRef"`)
	out := decodeAs[comatproto.AdminUpdateSubjectStatus_Output](t, res)
	require.Equal(t, uris[0], out.Subject.RepoStrongRef.Uri)
	require.True(t, out.Takedown.Applied)

	e.get(t, "com.atproto.repo.getRecord", "", recordQ).fails(t, http.StatusBadRequest, "RecordNotFound")
	e.get(t, "com.atproto.sync.getRecord", "", syncRecordQ).fails(t, http.StatusBadRequest, "RecordNotFound")
	require.Equal(t, uris[1:], listed())
	// The rest of the repo is still served.
	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).ok(t)
	status = decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", uriQ).ok(t))
	require.True(t, status.Takedown.Applied)
	require.Equal(t, ref, *status.Takedown.Ref)
	require.Equal(t, cids[0], status.Subject.RepoStrongRef.Cid)

	in.Takedown = &comatproto.AdminDefs_StatusAttr{Applied: false}
	e.adminProc(t, "updateSubjectStatus", &in).ok(t)
	e.get(t, "com.atproto.repo.getRecord", "", recordQ).ok(t)
	e.get(t, "com.atproto.sync.getRecord", "", syncRecordQ).ok(t)
	require.ElementsMatch(t, uris, listed())
	status = decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", uriQ).ok(t))
	require.False(t, status.Takedown.Applied)

	require.Equal(t, []string{"com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus"}, auditActions(t, e.pool, uris[0]))

	// A handle in the URI names the same record.
	byHandle := "at://" + u.handle + "/app.bsky.feed.post/" + rkey
	status = decodeAs[comatproto.AdminGetSubjectStatus_Output](t, e.adminQuery(t, "getSubjectStatus", url.Values{"uri": {byHandle}}).ok(t))
	require.Equal(t, uris[0], status.Subject.RepoStrongRef.Uri)

	// Bad input.
	missing := "at://" + u.did.String() + "/app.bsky.feed.post/3zzzzzzzzzzzz"
	e.adminQuery(t, "getSubjectStatus", url.Values{"uri": {missing}}).fails(t, http.StatusBadRequest, "NotFound")
	e.adminQuery(t, "getSubjectStatus", url.Values{"uri": {"at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/x"}}).fails(t, http.StatusBadRequest, "NotFound")
	e.adminQuery(t, "getSubjectStatus", url.Values{"uri": {"https://example.com"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminQuery(t, "getSubjectStatus", url.Values{"uri": {"at://" + u.did.String()}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	before := e.rowCounts(t)
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.repo.strongRef", "uri": uris[0], "cid": "not-a-cid"},
		"takedown": map[string]any{"applied": true},
	}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.repo.strongRef", "uri": "at://nobody.test/app.bsky.feed.post/x", "cid": cids[0]},
		"takedown": map[string]any{"applied": true},
	}).fails(t, http.StatusBadRequest, "AccountNotFound")
	e.adminProc(t, "updateSubjectStatus", map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.repo.strongRef", "uri": uris[0], "cid": cids[0]},
		"takedown": map[string]any{"applied": true, "ref": strings.Repeat("r", maxAdminRefLen+1)},
	}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Equal(t, before, e.rowCounts(t))
	e.get(t, "com.atproto.repo.getRecord", "", recordQ).ok(t)
}
func TestAdminTakedownBlob(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{configure: func(c *config.Config) { c.AdminPassword = testAdminPassword }})
	did := b.newAccount(t, "blobby", account.StatusActive)
	ref := b.uploadOK(t, did, pngData(t, 2000), "image/png")
	require.NoError(t, b.postBlobs(t, did, "p1", ref))
	blobQ := url.Values{"did": {did.String()}, "cid": {ref.Ref.String()}}
	resp, body := b.get(t, "com.atproto.sync.getBlob", blobQ)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %.200s", body)

	statusQ := url.Values{"did": {did.String()}, "blob": {ref.Ref.String()}}
	status := decodeAs[comatproto.AdminGetSubjectStatus_Output](t, atAdmin(t, b.url, "getSubjectStatus", testAdminPassword, nil, statusQ).ok(t))
	require.NotNil(t, status.Subject.AdminDefs_RepoBlobRef)
	require.Equal(t, did.String(), status.Subject.AdminDefs_RepoBlobRef.Did)
	require.Equal(t, ref.Ref.String(), status.Subject.AdminDefs_RepoBlobRef.Cid)
	require.False(t, status.Takedown.Applied)

	tref := "dmca-9"
	in := comatproto.AdminUpdateSubjectStatus_Input{
		Subject: &comatproto.AdminUpdateSubjectStatus_Input_Subject{AdminDefs_RepoBlobRef: &comatproto.AdminDefs_RepoBlobRef{
			Did: did.String(), Cid: ref.Ref.String(),
		}},
		Takedown: &comatproto.AdminDefs_StatusAttr{Applied: true, Ref: &tref},
	}
	res := atAdmin(t, b.url, "updateSubjectStatus", testAdminPassword, &in, nil).ok(t)
	require.Contains(t, string(res.body), `"$type":"com.atproto.admin.defs#repoBlobRef"`)
	out := decodeAs[comatproto.AdminUpdateSubjectStatus_Output](t, res)
	require.Equal(t, ref.Ref.String(), out.Subject.AdminDefs_RepoBlobRef.Cid)

	resp, body = b.get(t, "com.atproto.sync.getBlob", blobQ)
	requireXRPC(t, resp, body, http.StatusBadRequest, "BlobNotFound")
	status = decodeAs[comatproto.AdminGetSubjectStatus_Output](t, atAdmin(t, b.url, "getSubjectStatus", testAdminPassword, nil, statusQ).ok(t))
	require.True(t, status.Takedown.Applied)
	require.Equal(t, tref, *status.Takedown.Ref)

	in.Takedown = &comatproto.AdminDefs_StatusAttr{Applied: false}
	atAdmin(t, b.url, "updateSubjectStatus", testAdminPassword, &in, nil).ok(t)
	resp, body = b.get(t, "com.atproto.sync.getBlob", blobQ)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %.200s", body)

	require.Equal(t, []string{"com.atproto.admin.updateSubjectStatus", "com.atproto.admin.updateSubjectStatus"},
		auditActions(t, b.pool, did.String()+"/blob/"+ref.Ref.String()))

	// Bad input.
	unknownBlob := url.Values{"did": {did.String()}, "blob": {"bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"}}
	atAdmin(t, b.url, "getSubjectStatus", testAdminPassword, nil, unknownBlob).fails(t, http.StatusBadRequest, "NotFound")
	atAdmin(t, b.url, "getSubjectStatus", testAdminPassword, nil, url.Values{"blob": {ref.Ref.String()}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	atAdmin(t, b.url, "getSubjectStatus", testAdminPassword, nil, url.Values{"did": {did.String()}, "blob": {"zzz"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	atAdmin(t, b.url, "updateSubjectStatus", testAdminPassword, map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoBlobRef", "did": did.String(), "cid": "zzz"},
		"takedown": map[string]any{"applied": true},
	}, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
}
