package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// adminPost calls an admin procedure with the given password.
func (e *accountEnv) adminPost(t *testing.T, nsid, password string, in any) xrpcResult {
	t.Helper()
	b, err := json.Marshal(in)
	require.NoError(t, err)
	h := http.Header{"Authorization": {"Basic " + basic("admin", password)}}
	return e.do(t, http.MethodPost, AdminNSIDPrefix+nsid, "", bytes.NewReader(b), nil, h)
}

func (e *accountEnv) adminGet(t *testing.T, nsid string, q url.Values) xrpcResult {
	t.Helper()
	h := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}
	return e.do(t, http.MethodGet, AdminNSIDPrefix+nsid, "", nil, q, h)
}

func (e *accountEnv) sequence(t *testing.T) {
	t.Helper()
	_, err := eventlog.NewSequencer(e.pool, eventlog.SequencerConfig{}).SequenceBatch(context.Background())
	require.NoError(t, err)
}

func TestAdminFirehoseRepair(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post("hello"),
	}).ok(t)
	e.sequence(t)

	var listed struct {
		Events []eventlog.EventInfo `json:"events"`
	}
	res := e.adminGet(t, "listEvents", url.Values{"did": {u.did.String()}, "kind": {"commit"}}).ok(t)
	require.NoError(t, json.Unmarshal(res.body, &listed))
	require.Len(t, listed.Events, 1)
	commitSeq := listed.Events[0].Seq
	require.Empty(t, listed.Events[0].Problems)

	// Wrong or missing credentials: 401 and nothing changes.
	before := e.rowCounts(t)
	e.adminPost(t, "rewriteEventAsSync", "wrong", map[string]any{"seq": commitSeq}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.post(t, AdminNSIDPrefix+"emitSync", u.access, map[string]any{"did": u.did}).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.get(t, AdminNSIDPrefix+"listEvents", "", nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	require.Equal(t, before, e.rowCounts(t))

	// Bad input: named 4xx errors.
	e.adminPost(t, "rewriteEventAsSync", testAdminPassword, map[string]any{"seq": 0}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminPost(t, "rewriteEventAsSync", testAdminPassword, map[string]any{"seq": 99999}).fails(t, http.StatusBadRequest, "EventNotFound")
	e.adminPost(t, "emitSync", testAdminPassword, map[string]any{"did": "nope"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminGet(t, "listEvents", url.Values{"kind": {"bogus"}}).fails(t, http.StatusBadRequest, "InvalidRequest")

	// Rewrite the commit as #sync, twice: the second changes nothing.
	var rr eventlog.RepairResult
	res = e.adminPost(t, "rewriteEventAsSync", testAdminPassword, map[string]any{"seq": commitSeq, "reason": "test"}).ok(t)
	require.NoError(t, json.Unmarshal(res.body, &rr))
	require.True(t, rr.Changed)
	require.Equal(t, eventlog.KindSync, rr.After.Kind)
	res = e.adminPost(t, "rewriteEventAsSync", testAdminPassword, map[string]any{"seq": commitSeq}).ok(t)
	require.NoError(t, json.Unmarshal(res.body, &rr))
	require.False(t, rr.Changed)

	// A fresh #sync for the repo at its current commit.
	kinds := len(e.eventKinds(t, u.did))
	e.adminPost(t, "emitSync", testAdminPassword, map[string]any{"did": u.did, "reason": "relay lost track"}).ok(t)
	require.Len(t, e.eventKinds(t, u.did), kinds+1)
	require.Equal(t, "sync", e.eventKinds(t, u.did)[kinds])

	res = e.adminPost(t, "raiseSeq", testAdminPassword, map[string]any{"floor": 1000}).ok(t)
	require.Equal(t, float64(1000), res.json(t)["lastSeq"])
	e.adminPost(t, "invalidateEvent", testAdminPassword, map[string]any{"seq": commitSeq}).ok(t)

	var audit struct {
		Entries []struct {
			Action  string `json:"action"`
			Subject string `json:"subject"`
		} `json:"entries"`
	}
	res = e.adminGet(t, "listAuditLog", nil).ok(t)
	require.NoError(t, json.Unmarshal(res.body, &audit))
	var actions []string
	for _, a := range audit.Entries {
		actions = append(actions, a.Action)
	}
	require.Subset(t, actions, []string{"firehose.rewriteAsSync", "firehose.emitSync", "firehose.raiseSeq", "firehose.invalidate"})
	require.Len(t, actions, 4+countOther(actions), "one entry per change, none for the no-op rewrite")
}

// countOther counts audit actions not made by this test (account admin
// operations other code may audit).
func countOther(actions []string) int {
	n := 0
	for _, a := range actions {
		switch a {
		case "firehose.rewriteAsSync", "firehose.emitSync", "firehose.raiseSeq", "firehose.invalidate":
		default:
			n++
		}
	}
	return n
}
