package pds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/stretchr/testify/require"
)

func post(text string) map[string]any {
	return map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T12:00:00.000Z"}
}

// blockOfSize returns a record of collection whose DAG-CBOR block is
// exactly size bytes.
func blockOfSize(t testing.TB, collection string, size int, seed string) map[string]any {
	t.Helper()
	mk := func(n int) map[string]any {
		return map[string]any{"$type": collection, "text": seed + strings.Repeat("a", n-len(seed))}
	}
	b, err := atdata.MarshalCBOR(mk(size))
	require.NoError(t, err)
	rec := mk(size - (len(b) - size))
	b, err = atdata.MarshalCBOR(rec)
	require.NoError(t, err)
	require.Equal(t, size, len(b))
	return rec
}

func TestRepoAPIEndToEnd(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}

	// createRecord, with and without rkey; validation reported.
	c1 := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "record": post("first"),
	}).ok(t).json(t)
	require.Equal(t, "valid", c1["validationStatus"])
	uri1 := c1["uri"].(string)
	require.True(t, strings.HasPrefix(uri1, "at://"+u.did.String()+"/app.bsky.feed.post/"))
	commit1 := c1["commit"].(map[string]any)
	require.NotEmpty(t, commit1["rev"])

	c2 := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.handle, "collection": "com.example.thing", "rkey": "self", "record": map[string]any{"$type": "com.example.thing", "n": 1},
	}).ok(t).json(t)
	require.Equal(t, "unknown", c2["validationStatus"])
	require.Equal(t, "at://"+u.did.String()+"/com.example.thing/self", c2["uri"])

	// The same rkey again is refused.
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "com.example.thing", "rkey": "self", "record": map[string]any{"n": 2},
	}).fails(t, 400, "InvalidRequest")

	// putRecord replaces; swapRecord guards it.
	p := e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{
		"repo": u.did, "collection": "com.example.thing", "rkey": "self", "record": map[string]any{"$type": "com.example.thing", "n": 2},
		"swapRecord": c2["cid"],
	}).ok(t).json(t)
	require.NotEqual(t, c2["cid"], p["cid"])
	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{
		"repo": u.did, "collection": "com.example.thing", "rkey": "self", "record": map[string]any{"n": 3}, "swapRecord": c2["cid"],
	}).fails(t, 400, "InvalidSwap")
	e.post(t, "com.atproto.repo.putRecord", u.access, map[string]any{
		"repo": u.did, "collection": "com.example.thing", "rkey": "self", "record": map[string]any{"n": 3}, "swapRecord": nil,
	}).fails(t, 400, "InvalidSwap")

	// getRecord.
	g := e.get(t, "com.atproto.repo.getRecord", "", q("repo", u.did.String(), "collection", "com.example.thing", "rkey", "self")).ok(t).json(t)
	require.Equal(t, p["cid"], g["cid"])
	require.EqualValues(t, 2, g["value"].(map[string]any)["n"])
	e.get(t, "com.atproto.repo.getRecord", "", q("repo", u.handle, "collection", "com.example.thing", "rkey", "nope")).fails(t, 400, "RecordNotFound")
	e.get(t, "com.atproto.repo.getRecord", "", q("repo", "did:plc:nobodynobodynobody", "collection", "com.example.thing", "rkey", "self")).fails(t, 400, "RepoNotFound")
	e.get(t, "com.atproto.repo.getRecord", "", q("repo", u.did.String(), "collection", "com.example.thing", "rkey", "self", "cid", c2["cid"].(string))).fails(t, 400, "RecordNotFound")

	// applyWrites: create, update, delete in one commit.
	aw := e.post(t, "com.atproto.repo.applyWrites", u.access, map[string]any{
		"repo": u.did,
		"writes": []map[string]any{
			{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "rkey": "3aaaaaaaaaaa2", "value": post("batch 1")},
			{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": post("batch 2")},
			{"$type": "com.atproto.repo.applyWrites#update", "collection": "com.example.thing", "rkey": "self", "value": map[string]any{"$type": "com.example.thing", "n": 4}},
			{"$type": "com.atproto.repo.applyWrites#delete", "collection": "app.bsky.feed.post", "rkey": strings.TrimPrefix(uri1, "at://"+u.did.String()+"/app.bsky.feed.post/")},
		},
	}).ok(t).json(t)
	results := aw["results"].([]any)
	require.Len(t, results, 4)
	require.Equal(t, "com.atproto.repo.applyWrites#createResult", results[0].(map[string]any)["$type"])
	require.Equal(t, "valid", results[0].(map[string]any)["validationStatus"])
	require.Equal(t, "com.atproto.repo.applyWrites#updateResult", results[2].(map[string]any)["$type"])
	require.Equal(t, "com.atproto.repo.applyWrites#deleteResult", results[3].(map[string]any)["$type"])

	// listRecords, both orders, with paging.
	l := e.get(t, "com.atproto.repo.listRecords", "", q("repo", u.did.String(), "collection", "app.bsky.feed.post", "limit", "1")).ok(t).json(t)
	require.Len(t, l["records"], 1)
	require.NotEmpty(t, l["cursor"])
	l2 := e.get(t, "com.atproto.repo.listRecords", "", q("repo", u.did.String(), "collection", "app.bsky.feed.post", "limit", "1", "cursor", l["cursor"].(string))).ok(t).json(t)
	require.Len(t, l2["records"], 1)
	require.NotEqual(t, l["records"], l2["records"])
	rev := e.get(t, "com.atproto.repo.listRecords", "", q("repo", u.did.String(), "collection", "app.bsky.feed.post", "reverse", "true")).ok(t).json(t)
	require.Len(t, rev["records"], 2)
	require.Equal(t, "at://"+u.did.String()+"/app.bsky.feed.post/3aaaaaaaaaaa2", rev["records"].([]any)[0].(map[string]any)["uri"])
	e.get(t, "com.atproto.repo.listRecords", "", q("repo", u.did.String(), "collection", "app.bsky.feed.post", "limit", "1000")).fails(t, 400, "InvalidRequest")

	// deleteRecord.
	d := e.post(t, "com.atproto.repo.deleteRecord", u.access, map[string]any{"repo": u.did, "collection": "com.example.thing", "rkey": "self"}).ok(t).json(t)
	require.NotNil(t, d["commit"])
	e.get(t, "com.atproto.repo.getRecord", "", q("repo", u.did.String(), "collection", "com.example.thing", "rkey", "self")).fails(t, 400, "RecordNotFound")

	// describeRepo.
	dr := e.get(t, "com.atproto.repo.describeRepo", "", q("repo", u.handle)).ok(t).json(t)
	require.Equal(t, u.did.String(), dr["did"])
	require.Equal(t, []any{"app.bsky.feed.post"}, dr["collections"])
	require.Equal(t, true, dr["handleIsCorrect"])
	doc := dr["didDoc"].(map[string]any)
	require.Equal(t, e.cfg.PublicURL(), doc["service"].([]any)[0].(map[string]any)["serviceEndpoint"])

	// Every write became one #commit after the account's three events.
	kinds := e.eventKinds(t, u.did)
	require.Equal(t, []string{"identity", "account", "sync", "commit", "commit", "commit", "commit", "commit"}, kinds)
}

func TestRepoWriteRefusals(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	other := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("one")}).ok(t)
	head, err := e.engine.GetHead(t.Context(), u.did)
	require.NoError(t, err)

	write := func(i int, rec map[string]any) map[string]any {
		return map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": rec["$type"], "rkey": fmt.Sprintf("k%04d", i), "value": rec}
	}
	writes := func(n int, mk func(i int) map[string]any) []map[string]any {
		out := make([]map[string]any, n)
		for i := range out {
			out[i] = write(i, mk(i))
		}
		return out
	}
	create := func(rec any) map[string]any {
		return map[string]any{"repo": u.did, "collection": "com.example.big", "record": rec}
	}

	before := e.rowCounts(t)
	cases := []struct {
		name   string
		nsid   string
		token  string
		body   any
		status int
		error  string
		msg    string
	}{
		{name: "another account's repo", nsid: "com.atproto.repo.createRecord", token: other.access,
			body: map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("mine now")}, status: 403, error: "Forbidden"},
		{name: "another account's handle", nsid: "com.atproto.repo.deleteRecord", token: other.access,
			body: map[string]any{"repo": u.handle, "collection": "app.bsky.feed.post", "rkey": "x"}, status: 403, error: "Forbidden"},
		{name: "no session", nsid: "com.atproto.repo.createRecord",
			body: map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("anon")}, status: 401, error: "AuthenticationRequired"},
		{name: "201 writes", nsid: "com.atproto.repo.applyWrites", token: u.access,
			body: map[string]any{"repo": u.did, "writes": writes(201, func(i int) map[string]any { return post("p") })}, status: 400, error: "InvalidRequest", msg: "200"},
		{name: "1,000,001-byte record block", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: create(blockOfSize(t, "com.example.big", 1_000_001, "x")), status: 400, error: "InvalidRequest", msg: "1,000,001"},
		{name: "34 x 60 KB in one applyWrites (commit blocks over 2,000,000)", nsid: "com.atproto.repo.applyWrites", token: u.access,
			body: map[string]any{"repo": u.did, "writes": writes(34, func(i int) map[string]any {
				return blockOfSize(t, "com.example.big", 60_000, fmt.Sprint(i, "-"))
			})}, status: 400, error: "InvalidRequest", msg: "2,000,000"},
		{name: "50 x 60 KB in one applyWrites (body over 2 MiB)", nsid: "com.atproto.repo.applyWrites", token: u.access,
			body: map[string]any{"repo": u.did, "writes": writes(50, func(i int) map[string]any {
				return blockOfSize(t, "com.example.big", 60_000, fmt.Sprint(i, "-"))
			})}, status: 413, error: "PayloadTooLarge"},
		{name: "float in a record", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: []byte(`{"repo":"` + u.did.String() + `","collection":"com.example.thing","record":{"$type":"com.example.thing","x":1.5}}`), status: 400, error: "InvalidRequest"},
		{name: "post failing its lexicon with validate=true", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "validate": true,
				"record": map[string]any{"$type": "app.bsky.feed.post", "text": 12}}, status: 400, error: "InvalidRequest"},
		{name: "post failing its lexicon with validate unset", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "app.bsky.feed.post",
				"record": map[string]any{"$type": "app.bsky.feed.post", "text": "no createdAt"}}, status: 400, error: "InvalidRequest"},
		{name: "unknown lexicon with validate=true", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "com.example.thing", "validate": true,
				"record": map[string]any{"$type": "com.example.thing"}}, status: 400, error: "InvalidRequest"},
		{name: "swapCommit mismatch", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("swap"),
				"swapCommit": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}, status: 400, error: "InvalidSwap"},
		{name: "$type mismatch", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "com.example.thing", "record": post("wrong type")}, status: 400, error: "InvalidRequest"},
		{name: "bad collection", nsid: "com.atproto.repo.createRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "not an nsid", "record": map[string]any{}}, status: 400, error: "InvalidRequest"},
		{name: "bad rkey", nsid: "com.atproto.repo.putRecord", token: u.access,
			body: map[string]any{"repo": u.did, "collection": "com.example.thing", "rkey": "a/b", "record": map[string]any{}}, status: 400, error: "InvalidRequest"},
		{name: "bad write type", nsid: "com.atproto.repo.applyWrites", token: u.access,
			body: map[string]any{"repo": u.did, "writes": []map[string]any{{"$type": "nope", "collection": "com.example.thing"}}}, status: 400, error: "InvalidRequest"},
		{name: "malformed JSON", nsid: "com.atproto.repo.createRecord", token: u.access, body: []byte(`{"repo":`), status: 400, error: "InvalidRequest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			switch v := tc.body.(type) {
			case []byte:
				b = v
			default:
				b, err = json.Marshal(v)
				require.NoError(t, err)
			}
			msg := e.do(t, http.MethodPost, tc.nsid, tc.token, bytes.NewReader(b), nil, nil).fails(t, tc.status, tc.error)
			if tc.msg != "" {
				require.Contains(t, msg, tc.msg)
			}
		})
	}
	require.Equal(t, before, e.rowCounts(t), "refused writes change nothing")
	after, err := e.engine.GetHead(t.Context(), u.did)
	require.NoError(t, err)
	require.Equal(t, head.Rev, after.Rev)
}

func TestValidateFalseSkipsLexicon(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	res := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "validate": false,
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "no createdAt"},
	}).ok(t).json(t)
	_, has := res["validationStatus"]
	require.False(t, has, "validate=false reports no status, as the reference PDS")
	// The data model still applies with validation off.
	e.do(t, http.MethodPost, "com.atproto.repo.createRecord", u.access, strings.NewReader(
		`{"repo":"`+u.did.String()+`","collection":"app.bsky.feed.post","validate":false,"record":{"$type":"app.bsky.feed.post","n":0.5}}`), nil, nil).
		fails(t, 400, "InvalidRequest")
	// A record without $type gets the collection's.
	res = e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "com.example.untyped", "record": map[string]any{"a": "b"},
	}).ok(t).json(t)
	require.Equal(t, "unknown", res["validationStatus"])
}
