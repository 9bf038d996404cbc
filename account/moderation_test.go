package account

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
)

// auditJSON lists the audit entries about subject, oldest first, as
// "action before after" with the states as JSON, keys sorted (jsonb keeps
// its own order).
func auditJSON(t *testing.T, s *Service, subject string) []string {
	t.Helper()
	entries, err := audit.List(context.Background(), s.pool, subject, 0, 100)
	require.NoError(t, err)
	var out []string
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		out = append(out, e.Action+" "+sortedJSON(t, e.Before)+" "+sortedJSON(t, e.After))
	}
	return out
}

func sortedJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	var generic any
	require.NoError(t, json.Unmarshal(raw, &generic))
	b, err := json.Marshal(generic)
	require.NoError(t, err)
	return string(b)
}

func entry(subject string) *audit.Entry {
	return &audit.Entry{Actor: "admin", Action: "moderate", Subject: subject}
}

func TestModerateAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, sess, err := s.CreateAccount(ctx, CreateInput{Handle: "moddy.test", Email: "moddy@example.com", Password: "moddy password"})
	require.NoError(t, err)
	ref := "ticket-1"

	// A takedown: the status, the ref, the sessions, the audit entry.
	require.NoError(t, s.ModerateAccount(ctx, a.DID, Moderation{Takedown: &StatusAttr{Applied: true, Ref: &ref}}, entry(a.DID.String())))
	st, err := s.Status(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, StatusTakendown, st)
	td, err := s.Takedown(ctx, a.DID, TakedownAccount, "")
	require.NoError(t, err)
	require.Equal(t, ref, td.Ref)
	_, err = s.Authenticate(ctx, sess.AccessJwt)
	require.ErrorIs(t, err, ErrInvalidToken, "a takedown ends the sessions")

	// Deactivating a taken-down account changes nothing; reversing the
	// takedown makes it active, and drops the ref.
	require.NoError(t, s.ModerateAccount(ctx, a.DID, Moderation{Deactivated: &StatusAttr{Applied: true}}, entry(a.DID.String())))
	st, err = s.Status(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, StatusTakendown, st)
	require.NoError(t, s.ModerateAccount(ctx, a.DID, Moderation{Takedown: &StatusAttr{}}, entry(a.DID.String())))
	st, err = s.Status(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, StatusActive, st)
	td, err = s.Takedown(ctx, a.DID, TakedownAccount, "")
	require.NoError(t, err)
	require.Nil(t, td)

	require.Equal(t, []string{
		`moderate {"status":"active"} {"status":"takendown","takedown":{"applied":true,"ref":"ticket-1"}}`,
		`moderate {"status":"takendown"} {"deactivated":{"applied":true},"status":"takendown"}`,
		`moderate {"status":"takendown"} {"status":"active","takedown":{"applied":false}}`,
	}, auditJSON(t, s, a.DID.String()))

	// Nothing to change: not even an unknown account is an error. An
	// unknown account with something to change is ErrAccountNotFound, and
	// nothing is audited.
	unknown := syntax.DID("did:plc:unknownunknownunknown")
	require.NoError(t, s.ModerateAccount(ctx, unknown, Moderation{}, entry(unknown.String())))
	require.ErrorIs(t, s.ModerateAccount(ctx, unknown, Moderation{Takedown: &StatusAttr{Applied: true}}, entry(unknown.String())), ErrAccountNotFound)
	require.Empty(t, auditJSON(t, s, unknown.String()))
}

func TestSetTakedown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "down.test", Email: "down@example.com", Password: "down password"})
	require.NoError(t, err)
	coll, rkey := syntax.NSID("app.bsky.feed.post"), syntax.RecordKey("3aaaaaaaaaaa2")
	rec := &Takedown{DID: a.DID, Kind: TakedownRecord, Subject: RecordSubject(coll, rkey), CID: "bafyfake", Ref: "report-7"}

	require.NoError(t, s.SetTakedown(ctx, rec, true, entry("rec")))
	down, err := s.RecordTakendown(ctx, a.DID, coll, rkey)
	require.NoError(t, err)
	require.True(t, down)
	keys, err := s.TakendownRecordKeys(ctx, a.DID, coll)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{rkey.String(): true}, keys)
	require.NoError(t, s.SetTakedown(ctx, rec, false, entry("rec")))
	down, err = s.RecordTakendown(ctx, a.DID, coll, rkey)
	require.NoError(t, err)
	require.False(t, down)
	require.Equal(t, []string{
		`moderate {"takedown":{"applied":false}} {"takedown":{"applied":true,"ref":"report-7"}}`,
		`moderate {"takedown":{"applied":true,"ref":"report-7"}} {"takedown":{"applied":false}}`,
	}, auditJSON(t, s, "rec"))

	// The takedown and its audit entry commit together: an entry Postgres
	// refuses leaves the blob served.
	blob := &Takedown{DID: a.DID, Kind: TakedownBlob, Subject: "bafkblob"}
	bad := entry("blob\x00")
	require.ErrorIs(t, s.SetTakedown(ctx, blob, true, bad), db.ErrInvalidText)
	down, err = s.BlobTakendown(ctx, a.DID, "bafkblob")
	require.NoError(t, err)
	require.False(t, down)
	require.NoError(t, s.SetTakedown(ctx, blob, true, entry("blob")))
	down, err = s.BlobTakendown(ctx, a.DID, "bafkblob")
	require.NoError(t, err)
	require.True(t, down)
}

func TestListRepos(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	var dids []syntax.DID
	for _, h := range []string{"one.test", "two.test", "three.test"} {
		a, _, err := s.CreateAccount(ctx, CreateInput{Handle: h, Email: "x" + h + "@example.com", Password: "list password"})
		require.NoError(t, err)
		dids = append(dids, a.DID)
	}
	require.NoError(t, s.SetStatus(ctx, dids[1], StatusDeactivated))
	// A repository left without its account row.
	_, err := s.pool.Exec(ctx, "DELETE FROM accounts WHERE did = $1", dids[2].String())
	require.NoError(t, err)

	all, err := ListRepos(ctx, s.pool, "", 10)
	require.NoError(t, err)
	require.Len(t, all, 3)
	want := map[syntax.DID]Status{dids[0]: StatusActive, dids[1]: StatusDeactivated, dids[2]: ""}
	for i, r := range all {
		if i > 0 {
			require.Less(t, all[i-1].DID.String(), r.DID.String(), "DID order")
		}
		require.Equal(t, want[r.DID], r.Status, r.DID)
		head, err := s.repo.GetHead(ctx, r.DID)
		require.NoError(t, err)
		require.Equal(t, head.Commit, r.Head)
		require.Equal(t, head.Rev, r.Rev)
	}
	page, err := ListRepos(ctx, s.pool, all[0].DID.String(), 1)
	require.NoError(t, err)
	require.Equal(t, []HostedRepo{all[1]}, page)
}
