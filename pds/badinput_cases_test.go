package pds

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// The bad-input sweep's cases (badinput_test.go): a valid baseline per
// method, built from its lexicon and a fixture account, and every
// malformation of it.

// sweepFixture is what the baseline inputs of one method refer to: an
// account of its own (so that one method's writes do not spoil another's
// sweep) with one record.
type sweepFixture struct {
	user        *user
	rkey        string
	recordCID   string
	recordURI   string
	commitCID   string
	rev         string
	freshHandle string
	freshEmail  string
}

func newSweepFixture(t *testing.T, env *accountEnv) *sweepFixture {
	t.Helper()
	u := env.createUser(t)
	res := env.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": post("sweep"),
	}).ok(t).json(t)
	uri := res["uri"].(string)
	commit := res["commit"].(map[string]any)
	n := userSeq.Add(1)
	return &sweepFixture{
		user: u, rkey: uri[strings.LastIndex(uri, "/")+1:], recordCID: res["cid"].(string), recordURI: uri,
		commitCID: commit["cid"].(string), rev: commit["rev"].(string),
		freshHandle: "fresh" + itoa(int(n)) + ".test", freshEmail: "fresh" + itoa(int(n)) + "@example.com",
	}
}

// skip marks a parameter or field left out of the baseline (it is still
// swept with bad values).
type skip struct{}

func isSkip(v any) bool { _, ok := v.(skip); return ok }

// queryValue is a valid value of parameter name, or skip{}.
func (fx *sweepFixture) queryValue(name string, p lexProp) any {
	did := fx.user.did.String()
	switch name {
	case "repo", "did", "subject", "account":
		return did
	case "dids":
		return []string{did}
	case "cids":
		return []string{fx.commitCID}
	case "collection":
		return "app.bsky.feed.post"
	case "rkey":
		return fx.rkey
	case "cid", "blob":
		return fx.recordCID
	case "uri":
		return fx.recordURI
	case "handle":
		return fx.user.handle
	case "since":
		return fx.rev
	case "limit":
		return "5"
	case "aud":
		return "did:web:example.com"
	case "lxm":
		return "app.bsky.feed.getTimeline"
	case "sort":
		return "recent"
	case "kind":
		return "commit"
	case "cursor", "exp":
		return skip{}
	}
	if v, ok := fx.formatValue(p.Format, fx.user.handle); ok {
		return v
	}
	switch p.Type {
	case "integer":
		return "1"
	case "boolean":
		return "true"
	case "array":
		return []string{"x"}
	}
	return "x"
}

// formatValue is a valid value of a string format, handle standing for
// the handle format (an existing one for queries, a fresh one for
// bodies); false for a format it does not know.
func (fx *sweepFixture) formatValue(format, handle string) (string, bool) {
	switch format {
	case "did", "at-identifier":
		return fx.user.did.String(), true
	case "handle":
		return handle, true
	case "nsid":
		return "app.bsky.feed.post", true
	case "record-key":
		return fx.rkey, true
	case "cid":
		return fx.recordCID, true
	case "at-uri":
		return fx.recordURI, true
	case "tid":
		return fx.rev, true
	case "datetime":
		return time.Now().UTC().Format(time.RFC3339), true
	}
	return "", false
}

// bodyValue is a valid value of body field name, or skip{}.
func (fx *sweepFixture) bodyValue(name string, p lexProp) any {
	did := fx.user.did.String()
	switch name {
	case "repo", "did", "account", "forAccount":
		return did
	case "accounts", "forAccounts":
		return []any{did}
	case "collection":
		return "app.bsky.feed.post"
	case "rkey":
		return fx.rkey
	case "record":
		return post("bad input sweep")
	case "validate":
		return true
	case "writes":
		return []any{map[string]any{"$type": applyWritesNS + "create", "collection": "app.bsky.feed.post", "value": post("sweep")}}
	case "handle":
		return fx.freshHandle
	case "email":
		return fx.freshEmail
	case "password":
		// Wrong for deleteAccount and createSession: a baseline must not
		// delete or log in by accident.
		return "wrong horse battery"
	case "identifier":
		return fx.user.handle
	case "subject":
		return map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": did}
	case "takedown", "deactivated":
		return map[string]any{"applied": false}
	case "codes":
		return []any{"no-such-code"}
	case "name":
		return "sweep-app-password"
	case "deleteAfter":
		return time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	case "seq", "floor", "useCount", "codeCount":
		return 1
	case "reason", "note":
		return "bad-input sweep"
	case "swapCommit", "swapRecord", "inviteCode", "plcOp", "recoveryKey", "token",
		"verificationCode", "verificationPhone", "authFactorToken":
		return skip{}
	}
	if v, ok := fx.formatValue(p.Format, fx.freshHandle); ok {
		return v
	}
	switch p.Type {
	case "integer":
		return 1
	case "boolean":
		return false
	case "array":
		return []any{}
	case "string":
		return "x"
	}
	return map[string]any{}
}

// sweepCase is one request.
type sweepCase struct {
	name   string
	verb   string
	query  string // raw query string
	body   []byte // nil: no body
	ctype  string // Content-Type; "" sends none
	header http.Header
	// statusOnly is for HEAD: there is no body to check.
	statusOnly bool
}

func jsonCase(name string, body []byte) sweepCase {
	return sweepCase{name: name, verb: http.MethodPost, body: body, ctype: "application/json"}
}

// queryCases sweeps a query's parameters. full=false is the short list for
// a mode the method refuses before reading its input (401).
func queryCases(fx *sweepFixture, s lexSchema, full bool) []sweepCase {
	params := s.params
	if len(params) == 0 {
		// A method without parameters: common ones, which it must
		// ignore, and no per-parameter sweep.
		params, full = genericSchema.params, false
	}
	names := sortedKeys(params)
	base := url.Values{}
	for _, n := range names {
		switch v := fx.queryValue(n, params[n]).(type) {
		case string:
			base.Set(n, v)
		case []string:
			base[n] = v
		}
	}
	get := func(name string, q url.Values) sweepCase {
		return sweepCase{name: name, verb: http.MethodGet, query: q.Encode()}
	}
	with := func(n string, vs ...string) url.Values {
		q := url.Values{}
		for k, v := range base {
			q[k] = slices.Clone(v)
		}
		if vs == nil {
			q.Del(n)
		} else {
			q[n] = vs
		}
		return q
	}
	var out []sweepCase
	out = append(out, get("baseline", base), get("no parameters", nil))
	for _, b := range badStrings {
		all := url.Values{}
		for _, n := range names {
			all.Set(n, b.value)
		}
		out = append(out, get("every parameter "+b.label, all))
	}
	out = append(out,
		sweepCase{name: "HEAD baseline", verb: http.MethodHead, query: base.Encode(), statusOnly: true},
		sweepCase{name: "HEAD no parameters", verb: http.MethodHead, statusOnly: true},
		sweepCase{name: "POST to a query", verb: http.MethodPost, query: base.Encode(), body: []byte("{}"), ctype: "application/json"})
	if !full {
		return out
	}
	for _, n := range names {
		out = append(out, get(n+" missing", with(n)))
		for _, b := range badStrings {
			if b.value == "" {
				out = append(out, get(n+" empty", with(n, "")))
				continue
			}
			out = append(out, get(n+"="+b.label, with(n, b.value)))
		}
		valid := base[n]
		if len(valid) == 0 {
			valid = []string{"x"}
		}
		out = append(out,
			get(n+" repeated", with(n, append(slices.Clone(valid), valid...)...)),
			get(n+" repeated with garbage", with(n, append(slices.Clone(valid), "not a did")...)),
			get(n+" repeated 1001 times", with(n, slices.Repeat(valid[:1], 1001)...)),
		)
	}
	for _, raw := range []string{"%zz", "did=%", "&&&&", ";", "=", "a=b=c", strings.Repeat("x=1&", 2000), base.Encode() + "&%gg=1"} {
		out = append(out, sweepCase{name: "raw query " + truncate(raw, 20), verb: http.MethodGet, query: raw})
	}
	return out
}

// procedureCases sweeps a procedure's body.
func procedureCases(fx *sweepFixture, s lexSchema, full bool) []sweepCase {
	var out []sweepCase
	for _, b := range genericBodies {
		out = append(out, jsonCase("body "+b.label, []byte(b.body)))
	}
	out = append(out, sweepCase{name: "no body", verb: http.MethodPost})
	if s.encoding != "" && s.encoding != "application/json" {
		// A raw upload (uploadBlob): content types and empty bodies.
		for _, ct := range []string{"", "image/png", "text/plain", "garbage;;==", "application/json", "multipart/form-data"} {
			out = append(out,
				sweepCase{name: "empty body as " + ct, verb: http.MethodPost, body: []byte{}, ctype: ct},
				sweepCase{name: "bytes as " + ct, verb: http.MethodPost, body: []byte("\x89PNG\r\n\x1a\nnot really"), ctype: ct})
		}
		out = append(out, sweepCase{name: "GET on a procedure", verb: http.MethodGet})
		return out
	}
	fields := s.fields
	if fields == nil && s.encoding == "" {
		// No input at all (activateAccount, refreshSession...): the
		// generic bodies are enough.
		out = append(out, sweepCase{name: "GET on a procedure", verb: http.MethodGet})
		return out
	}
	if fields == nil {
		fields = genericSchema.fields
	}
	names := sortedKeys(fields)
	base := map[string]any{}
	for _, n := range names {
		if v := fx.bodyValue(n, fields[n]); !isSkip(v) {
			base[n] = v
		}
	}
	baseJSON := mustJSON(base)
	// withRaw is base with field n set to the raw JSON v ("" deletes it).
	withRaw := func(n, v string) []byte {
		m := map[string]json.RawMessage{}
		for k, x := range base {
			m[k] = mustJSON(x)
		}
		if v == "" {
			delete(m, n)
		} else {
			m[n] = json.RawMessage(v)
		}
		return mustJSON(m)
	}
	out = append(out, jsonCase("baseline", baseJSON))
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "garbage;;==", "application/cbor", "application/json; charset=utf-8"} {
		out = append(out, sweepCase{name: "baseline as " + ct, verb: http.MethodPost, body: baseJSON, ctype: ct})
	}
	out = append(out, sweepCase{name: "GET on a procedure", verb: http.MethodGet})
	allBad := map[string]any{}
	for _, n := range names {
		allBad[n] = 1
	}
	out = append(out, jsonCase("every field a number", mustJSON(allBad)))
	for _, b := range badStrings {
		all := map[string]any{}
		for _, n := range names {
			all[n] = b.value
		}
		out = append(out, jsonCase("every field "+b.label, mustJSON(all)))
	}
	if !full {
		return out
	}
	for _, n := range names {
		p := fields[n]
		out = append(out, jsonCase(n+" missing", withRaw(n, "")))
		for _, wt := range wrongTypes {
			if wt.typ != "" && wt.typ == p.Type {
				continue
			}
			out = append(out, jsonCase(n+" "+wt.label, withRaw(n, wt.value)))
		}
		if p.Type == "string" || p.Type == "" {
			for _, b := range badStrings {
				out = append(out, jsonCase(n+"="+b.label, withRaw(n, string(mustJSON(b.value)))))
			}
		}
		if p.Type == "array" {
			for _, v := range []string{`[1]`, `[null]`, `[{}]`, `[[]]`, `["not a did"]`, `["did:plc:"]`, `["\u0000"]`, `["a\u0000b"]`, `["` + strings.Repeat("a", 3000) + `"]`,
				"[" + strings.TrimSuffix(strings.Repeat(`"x",`, 10000), ",") + "]"} {
				out = append(out, jsonCase(n+" array "+truncate(v, 20), withRaw(n, v)))
			}
		}
		// A repeated key: encoding/json keeps the last one.
		dup := append(bytes.TrimSuffix(slices.Clone(baseJSON), []byte("}")), []byte(`,"`+n+`":"not a did"}`)...)
		if len(base) == 0 {
			dup = []byte(`{"` + n + `":"x","` + n + `":"not a did"}`)
		}
		out = append(out, jsonCase(n+" repeated", dup))
		for label, v := range specialValues(n) {
			out = append(out, jsonCase(n+" "+label, withRaw(n, v)))
		}
	}
	return out
}

// specialValues are malformed values of fields whose shape matters more
// than a string's: records, applyWrites' writes, admin subjects.
func specialValues(field string) map[string]string {
	post := func(extra string) string {
		return `{"$type":"app.bsky.feed.post","text":"x","createdAt":"2026-01-01T00:00:00Z"` + extra + `}`
	}
	switch field {
	case "record", "value":
		return map[string]string{
			"not an object: string":  `"a string"`,
			"not an object: array":   `[1,2]`,
			"not an object: number":  `42`,
			"$type mismatch":         `{"$type":"app.bsky.feed.like","subject":{"uri":"at://did:plc:a/b/c","cid":"x"},"createdAt":"2026-01-01T00:00:00Z"}`,
			"$type number":           `{"$type":7,"text":"x"}`,
			"$type null":             `{"$type":null,"text":"x"}`,
			"$type empty":            `{"$type":"","text":"x"}`,
			"$type garbage":          `{"$type":"../..","text":"x"}`,
			"float":                  post(`,"n":1.5`),
			"huge integer":           post(`,"n":123456789012345678901234567890`),
			"bad $link":              post(`,"l":{"$link":"nope"}`),
			"$link not a string":     post(`,"l":{"$link":5}`),
			"$link with extra keys":  post(`,"l":{"$link":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm","x":1}`),
			"bad $bytes":             post(`,"b":{"$bytes":"!!!"}`),
			"$bytes not a string":    post(`,"b":{"$bytes":[]}`),
			"blob with bad ref":      post(`,"embed":{"$type":"app.bsky.embed.images","images":[{"alt":"","image":{"$type":"blob","ref":{"$link":"bafy"},"mimeType":"image/png","size":-1}}]}`),
			"blob not uploaded":      post(`,"embed":{"$type":"app.bsky.embed.images","images":[{"alt":"","image":{"$type":"blob","ref":{"$link":"bafkreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"},"mimeType":"image/png","size":10}}]}`),
			"blob fields wrong type": post(`,"blob":{"$type":"blob","ref":"x","mimeType":5,"size":"big"}`),
			"empty key":              post(`,"":1`),
			"NUL in key":             post(`,"a\u0000b":1`),
			"9000 nested arrays":     post(`,"deep":` + nested(9000, false)),
			"9000 nested objects":    post(`,"deep":` + nested(9000, true)),
			"text of wrong type":     `{"$type":"app.bsky.feed.post","text":5,"createdAt":"2026-01-01T00:00:00Z"}`,
			"createdAt garbage":      `{"$type":"app.bsky.feed.post","text":"x","createdAt":"yesterday"}`,
			"3000-char $type":        `{"$type":"` + strings.Repeat("a", 3000) + `"}`,
		}
	case "writes":
		w := func(s string) string { return "[" + s + "]" }
		create := func(extra string) string {
			return `{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.post","value":` + post("") + extra + `}`
		}
		return map[string]string{
			"not an array":            `{"$type":"x"}`,
			"element string":          w(`"x"`),
			"element number":          w(`1`),
			"element null":            w(`null`),
			"element empty object":    w(`{}`),
			"unknown $type":           w(`{"$type":"` + applyWritesNS + `upsert","collection":"app.bsky.feed.post","rkey":"a","value":{}}`),
			"foreign $type":           w(`{"$type":"com.example.write#create","collection":"app.bsky.feed.post","value":{}}`),
			"$type number":            w(`{"$type":5,"collection":"app.bsky.feed.post"}`),
			"create without value":    w(`{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.post"}`),
			"create value not object": w(`{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.post","value":"x"}`),
			"create value mismatched": w(`{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.like","value":` + post("") + `}`),
			"update without rkey":     w(`{"$type":"` + applyWritesNS + `update","collection":"app.bsky.feed.post","value":` + post("") + `}`),
			"delete without rkey":     w(`{"$type":"` + applyWritesNS + `delete","collection":"app.bsky.feed.post"}`),
			"delete missing record":   w(`{"$type":"` + applyWritesNS + `delete","collection":"app.bsky.feed.post","rkey":"nothere"}`),
			"update missing record":   w(`{"$type":"` + applyWritesNS + `update","collection":"app.bsky.feed.post","rkey":"nothere","value":` + post("") + `}`),
			"bad collection":          w(`{"$type":"` + applyWritesNS + `create","collection":"../..","value":{}}`),
			"bad rkey":                w(`{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.post","rkey":"../..","value":` + post("") + `}`),
			"rkey wrong type":         w(`{"$type":"` + applyWritesNS + `create","collection":"app.bsky.feed.post","rkey":5,"value":` + post("") + `}`),
			"same rkey twice":         w(create(`,"rkey":"twice"`) + "," + create(`,"rkey":"twice"`)),
			"create then delete":      w(create(`,"rkey":"gone"`) + `,{"$type":"` + applyWritesNS + `delete","collection":"app.bsky.feed.post","rkey":"gone"}`),
			"201 writes":              w(strings.TrimSuffix(strings.Repeat(create("")+",", 201), ",")),
			"float in value":          w(create(`,"n":1.5`)),
		}
	case "subject":
		return map[string]string{
			"no $type":              `{"did":"did:plc:aaaa"}`,
			"unknown $type":         `{"$type":"com.example.nope","did":"did:plc:aaaa"}`,
			"$type number":          `{"$type":5}`,
			"repoRef bad did":       `{"$type":"com.atproto.admin.defs#repoRef","did":"not a did"}`,
			"repoRef did number":    `{"$type":"com.atproto.admin.defs#repoRef","did":5}`,
			"strongRef bad uri":     `{"$type":"com.atproto.repo.strongRef","uri":"../..","cid":"x"}`,
			"strongRef no record":   `{"$type":"com.atproto.repo.strongRef","uri":"at://did:plc:aaaa","cid":"x"}`,
			"strongRef bad cid":     `{"$type":"com.atproto.repo.strongRef","uri":"at://did:plc:aaaa/app.bsky.feed.post/x","cid":"nope"}`,
			"strongRef handle":      `{"$type":"com.atproto.repo.strongRef","uri":"at://nobody.test/app.bsky.feed.post/x","cid":""}`,
			"blobRef bad cid":       `{"$type":"com.atproto.admin.defs#repoBlobRef","did":"did:plc:aaaa","cid":"nope"}`,
			"blobRef bad did":       `{"$type":"com.atproto.admin.defs#repoBlobRef","did":"nope","cid":"bafkreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}`,
			"blobRef bad recordUri": `{"$type":"com.atproto.admin.defs#repoBlobRef","did":"did:plc:aaaa","cid":"bafkreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm","recordUri":"../.."}`,
		}
	case "takedown", "deactivated":
		return map[string]string{
			"applied string": `{"applied":"yes"}`,
			"ref number":     `{"applied":true,"ref":5}`,
			"ref too long":   `{"applied":false,"ref":"` + strings.Repeat("r", 2000) + `"}`,
			"ref NUL":        `{"applied":true,"ref":"a\u0000b"}`,
		}
	}
	return nil
}

// authCases send the baseline with broken credentials.
func authCases(verb string, s lexSchema) []sweepCase {
	tokens := []string{
		"Bearer", "Bearer ", "Bearer a b", "bearer x.y.z", "Basic !!!",
		"Basic " + base64.StdEncoding.EncodeToString([]byte("admin:wrong")),
		"Basic " + base64.StdEncoding.EncodeToString([]byte("no colon")),
		"Bearer " + strings.Repeat("a", 3000),
		// alg none, sub a DID: must not be accepted, nor crash.
		"Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJkaWQ6cGxjOmFhYWEiLCJzY29wZSI6ImNvbS5hdHByb3RvLmFjY2VzcyJ9.",
		"Bearer eyJhbGciOiJIUzI1NiJ9.bm90IGpzb24.c2ln",
		"DPoP abc",
		"DPoP " + strings.Repeat("a", 5000),
		// A well-formed token signed with another key, and no proof.
		"DPoP eyJhbGciOiJIUzI1NiIsInR5cCI6ImF0K2p3dCJ9.eyJzdWIiOiJkaWQ6cGxjOmFhYWEifQ.c2lnbmF0dXJl",
	}
	var out []sweepCase
	for _, tok := range tokens {
		c := sweepCase{name: "Authorization " + truncate(tok, 24), verb: verb, header: http.Header{"Authorization": {tok}}}
		if verb == http.MethodPost {
			c.body, c.ctype = []byte("{}"), "application/json"
			if s.encoding != "" && s.encoding != "application/json" {
				c.ctype = "image/png"
			}
		}
		out = append(out, c)
	}
	return out
}
