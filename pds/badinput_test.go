package pds

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
)

// The bad-input sweep. Every XRPC method in the server's method table is
// called with malformed input: unauthenticated, with a user's access token
// and, for methods that want HTTP Basic admin credentials, with the admin
// password. Whatever the input, the answer must not be a 5xx (a panic is
// one), and a 4xx must be the XRPC error shape with a name and a message.
//
// The inputs are derived, not listed per method: the parameters and body
// fields of a method come from its lexicon (the embedded com.atproto
// schemas), or from sweepSchemas for Bulwark's own methods, or from a
// generic set of common names for a method nobody described. A method
// added to the table is swept without touching this file.
//
// Not checked here: that a refused write left nothing behind (other tests
// compare row counts around their refusals), and the bodies of HEAD
// answers (there are none; only their status is).

// lexProp is one parameter or body field of a lexicon.
type lexProp struct {
	Type   string   `json:"type"`
	Format string   `json:"format"`
	Items  *lexProp `json:"items"`
}

// lexSchema is what the sweep needs to know about a method's input.
type lexSchema struct {
	// params are the query parameters (queries and subscriptions).
	params map[string]lexProp
	// fields are the JSON body fields (procedures with a JSON input).
	fields map[string]lexProp
	// encoding is the procedure's input encoding ("" for none).
	encoding string
}

// sweepSchemas describes the methods that have no lexicon in pds/lexicons.
var sweepSchemas = map[string]lexSchema{
	"_health": {},
	AdminNSIDPrefix + "listEvents": {params: map[string]lexProp{
		"from": {Type: "integer"}, "to": {Type: "integer"}, "did": {Type: "string", Format: "did"},
		"kind": {Type: "string"}, "overLimits": {Type: "boolean"}, "limit": {Type: "integer"},
	}},
	AdminNSIDPrefix + "listAuditLog": {params: map[string]lexProp{
		"subject": {Type: "string"}, "before": {Type: "integer"}, "limit": {Type: "integer"},
	}},
	AdminNSIDPrefix + "listConsumers": {},
	AdminNSIDPrefix + "rewriteEventAsSync": {encoding: "application/json", fields: map[string]lexProp{
		"seq": {Type: "integer"}, "reason": {Type: "string"},
	}},
	AdminNSIDPrefix + "invalidateEvent": {encoding: "application/json", fields: map[string]lexProp{
		"seq": {Type: "integer"}, "reason": {Type: "string"},
	}},
	AdminNSIDPrefix + "emitSync": {encoding: "application/json", fields: map[string]lexProp{
		"did": {Type: "string", Format: "did"}, "reason": {Type: "string"},
	}},
	AdminNSIDPrefix + "raiseSeq": {encoding: "application/json", fields: map[string]lexProp{
		"floor": {Type: "integer"}, "reason": {Type: "string"},
	}},
	AdminNSIDPrefix + "repairOversizedEvents": {encoding: "application/json", fields: map[string]lexProp{
		"reason": {Type: "string"},
	}},
}

// genericSchema is used for a method with neither a lexicon nor an entry in
// sweepSchemas: the names most methods take.
var genericSchema = lexSchema{
	params: map[string]lexProp{
		"did": {Type: "string", Format: "did"}, "repo": {Type: "string", Format: "at-identifier"},
		"collection": {Type: "string", Format: "nsid"}, "rkey": {Type: "string", Format: "record-key"},
		"cid": {Type: "string", Format: "cid"}, "uri": {Type: "string", Format: "at-uri"},
		"handle": {Type: "string", Format: "handle"}, "limit": {Type: "integer"}, "cursor": {Type: "string"},
		"since": {Type: "string", Format: "tid"},
	},
	encoding: "application/json",
	fields: map[string]lexProp{
		"did": {Type: "string", Format: "did"}, "repo": {Type: "string", Format: "at-identifier"},
		"handle": {Type: "string", Format: "handle"}, "collection": {Type: "string", Format: "nsid"},
		"rkey": {Type: "string", Format: "record-key"}, "record": {Type: "unknown"},
		"seq": {Type: "integer"}, "reason": {Type: "string"},
	},
}

// schemaFor reads nsid's input from its lexicon, or falls back.
func schemaFor(t *testing.T, nsid string) lexSchema {
	t.Helper()
	if s, ok := sweepSchemas[nsid]; ok {
		return s
	}
	raw, err := lexiconFS.ReadFile("lexicons/" + strings.ReplaceAll(nsid, ".", "/") + ".json")
	if err != nil {
		return genericSchema
	}
	var doc struct {
		Defs struct {
			Main struct {
				Parameters *struct {
					Properties map[string]lexProp `json:"properties"`
				} `json:"parameters"`
				Input *struct {
					Encoding string `json:"encoding"`
					Schema   *struct {
						Properties map[string]lexProp `json:"properties"`
					} `json:"schema"`
				} `json:"input"`
			} `json:"main"`
		} `json:"defs"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc), nsid)
	var s lexSchema
	m := doc.Defs.Main
	if m.Parameters != nil {
		s.params = m.Parameters.Properties
	}
	if m.Input != nil {
		s.encoding = m.Input.Encoding
		if m.Input.Schema != nil {
			s.fields = m.Input.Schema.Properties
		}
	}
	return s
}

// badString is a malformed value for a string parameter or field.
type badString struct{ label, value string }

var badStrings = []badString{
	{"empty", ""},
	{"did:plc:", "did:plc:"},
	{"did:web:%00", "did:web:%00"},
	{"did:web:NUL", "did:web:\x00"},
	{"did:key junk", "did:key:zzzz"},
	{"not a did", "not a did"},
	{"3000 chars", strings.Repeat("a", 3000)},
	{"3000-char did", "did:plc:" + strings.Repeat("a", 3000)},
	{"3000-char handle", strings.Repeat("a.", 1500) + "test"},
	{"unicode", "ünïcødé☃.test"},
	{"emoji", "🦋🦋🦋"},
	{"../..", "../.."},
	{"path traversal", "../../../../etc/passwd"},
	{"at-uri traversal", "at://did:plc:aaaa/../../x/y"},
	{"at-uri junk", "at://"},
	{"invalid UTF-8", "\xff\xfe\xfd"},
	{"NUL", "\x00"},
	{"-1", "-1"},
	{"0", "0"},
	{"1000000", "1000000"},
	{"abc", "abc"},
	{"2^63", "9223372036854775808"},
	{"-2^63-1", "-9223372036854775809"},
	{"1.5", "1.5"},
	{"space", " "},
	{"percent", "%"},
	{"null", "null"},
	{"cid junk", "bafyreinope"},
	{"tid junk", "3zzzzzzzzzzzz"},
	{"json", `{"$link":"x"}`},
}

// wrongTypes are JSON values of every type, for fields of another type.
var wrongTypes = []struct {
	label string
	value string
	typ   string // the lexicon type it is a valid value of
}{
	{"number", "1", "integer"},
	{"negative number", "-1", "integer"},
	{"huge number", "1e400", ""},
	{"float", "1.5", ""},
	{"bool", "true", "boolean"},
	{"string", `"x"`, "string"},
	{"object", `{}`, "object"},
	{"object with $type", `{"$type":"com.example.nope"}`, "object"},
	{"array", `[]`, "array"},
	{"array of numbers", `[1,2]`, ""},
	{"null", `null`, ""},
	{"5000 nested arrays", nested(5000, false), ""},
}

// nested returns n nested arrays (or objects).
func nested(n int, objects bool) string {
	if objects {
		return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
	}
	return strings.Repeat("[", n) + strings.Repeat("]", n)
}

// genericBodies are malformed bodies for any procedure.
var genericBodies = []struct{ label, body string }{
	{"empty", ""},
	{"whitespace", "  \n\t "},
	{"null", "null"},
	{"[]", "[]"},
	{"{", "{"},
	{"}", "}"},
	{"invalid UTF-8", "\xff\xfe\xfd"},
	{"invalid UTF-8 in a string", "{\"repo\":\"\xff\xfe\",\"did\":\"\xc3\x28\"}"},
	{"NUL", "\x00"},
	{"BOM", "\ufeff{}"},
	{"JSON string", `"a json string"`},
	{"JSON number", "123"},
	{"JSON bool", "true"},
	{"empty object", "{}"},
	{"two values", `{} {}`},
	{"trailing garbage", `{}garbage`},
	{"3000-char key", `{"` + strings.Repeat("k", 3000) + `":1}`},
	{"10000 nested arrays", nested(10000, false)},
	{"10001 nested arrays", nested(10001, false)},
	{"100000 nested arrays", nested(100000, false)},
	{"10000 nested objects", nested(10000, true)},
	{"unclosed string", `{"a":"`},
	{"single quotes", `{'a':1}`},
}

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

// sweeper sends cases and collects what is wrong with the answers.
type sweeper struct {
	env    *accountEnv
	client *http.Client
	logs   *lockedBuffer
	seq    atomic.Int64
	count  atomic.Int64

	mu sync.Mutex
	// answers counts answers by method and "status name", for the log.
	answers map[string]map[string]int
}

func (sw *sweeper) note(nsid string, status int, b []byte) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.answers[nsid] == nil {
		sw.answers[nsid] = map[string]int{}
	}
	k := itoa(status)
	if status >= 400 {
		k += " " + errorName(b)
	}
	sw.answers[nsid][k]++
}

// send sends c to nsid with auth and returns a complaint, or "".
// unimplemented accepts 501 MethodNotImplemented, the answer of a method
// this server registers but does not implement, whatever the input.
func (sw *sweeper) send(nsid string, auth http.Header, c sweepCase, unimplemented bool) string {
	id := "badinput-" + itoa(int(sw.seq.Add(1)))
	sw.count.Add(1)
	u := sw.env.url + "/xrpc/" + nsid
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	}
	req, err := http.NewRequest(c.verb, u, body)
	if err != nil {
		return "building request: " + err.Error()
	}
	req.URL.RawQuery = c.query
	if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	for k, vs := range auth {
		req.Header[k] = vs
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	req.Header.Set("X-Request-Id", id)
	resp, err := sw.client.Do(req)
	if err != nil {
		return fmt.Sprintf("no answer (%v)%s", err, sw.logs.about(id))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("status %d, body cut off (%v)%s", resp.StatusCode, err, sw.logs.about(id))
	}
	sw.note(nsid, resp.StatusCode, b)
	return sw.judge(id, c, resp, b, unimplemented)
}

func (sw *sweeper) judge(id string, c sweepCase, resp *http.Response, b []byte, unimplemented bool) string {
	status := resp.StatusCode
	if unimplemented && status == http.StatusNotImplemented && errorName(b) == "MethodNotImplemented" {
		return ""
	}
	switch {
	case status >= 500:
		return fmt.Sprintf("status %d: %s%s", status, truncate(string(b), 300), sw.logs.about(id))
	case status < 200 || status >= 300 && status < 400:
		return fmt.Sprintf("unexpected status %d: %s", status, truncate(string(b), 300))
	case status < 400 || c.statusOnly:
		return ""
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Sprintf("status %d with Content-Type %q: %s", status, ct, truncate(string(b), 300))
	}
	var e struct {
		Error   *string `json:"error"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Sprintf("status %d, body not JSON (%v): %s", status, err, truncate(string(b), 300))
	}
	if e.Error == nil || *e.Error == "" || e.Message == nil || *e.Message == "" {
		return fmt.Sprintf("status %d without an error name and message: %s", status, truncate(string(b), 300))
	}
	return ""
}

func errorName(b []byte) string {
	var e xrpcErrorBody
	_ = json.Unmarshal(b, &e)
	return e.Error
}

// lockedBuffer is the server's log, kept to explain a failure.
type lockedBuffer struct{ syncbuf.Buffer }

// about returns the log lines of request id, if any.
func (l *lockedBuffer) about(id string) string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, "request_id="+id+" ") {
			out = append(out, truncate(strings.TrimSpace(line), 2000))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "\n\tserver log: " + strings.Join(out, "\n\tserver log: ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("…(%d bytes)", len(s))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// sweepMode is a set of credentials the sweep calls with.
type sweepMode struct {
	name string
	auth http.Header
}

// badInputEnv is a server with every optional part on (accounts, repo,
// blobs, firehose) so that its method table is complete. No rate limits
// are configured (Options.Limits nil), as in the other account tests;
// subscribeRepos' own per-client admission (1/min, burst 5 by default) is
// widened as TestSubscribeBadRequests does, or the sweep would see little
// but 429s there.
func badInputEnv(t *testing.T, logs *lockedBuffer) *accountEnv {
	t.Helper()
	// sequence: commits get firehose seqs, so that the admin repair
	// methods find events to act on.
	return newAccountEnv(t, envOptions{sequence: true, options: func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		store, err := blob.NewDiskStore(o.Config.BlobDir)
		require.NoError(t, err)
		o.Blobs = blob.New(o.DB, store, blob.Config{MaxBytes: o.Config.BlobMaxBytes, TempTTL: o.Config.BlobTempTTL, Logger: o.Logger})
		hub := firehose.NewHub(o.DB, firehose.Config{PollInterval: time.Hour, Logger: o.Logger})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = hub.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		o.Firehose = hub
		o.FirehoseAdmission = &firehose.AdmissionConfig{Burst: 100000}
	}})
}

func TestBadInputNeverServerError(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	env := badInputEnv(t, logs)
	sw := &sweeper{env: env, logs: logs, client: &http.Client{Timeout: 30 * time.Second}, answers: map[string]map[string]int{}}
	admin := http.Header{"Authorization": {"Basic " + basic(AdminUser, testAdminPassword)}}

	methods := sortedKeys(env.server.methods)
	// Sanity: the table is the complete one (the sweep is only as good).
	for _, nsid := range []string{"com.atproto.repo.applyWrites", "com.atproto.repo.uploadBlob",
		"com.atproto.sync.subscribeRepos", "com.atproto.admin.updateSubjectStatus", AdminNSIDPrefix + "listEvents"} {
		require.Contains(t, methods, nsid)
	}
	start := time.Now()
	for _, nsid := range methods {
		m := env.server.methods[nsid]
		t.Run(nsid, func(t *testing.T) {
			t.Parallel()
			fx := newSweepFixture(t, env)
			schema := schemaFor(t, nsid)
			verb := http.MethodGet
			if m.kind == kindProcedure {
				verb = http.MethodPost
			}
			cases := func(full bool) []sweepCase {
				if m.kind == kindProcedure {
					return procedureCases(fx, schema, full)
				}
				return queryCases(fx, schema, full)
			}
			// A probe with no input tells which credentials the method
			// wants: a mode it answers 401 gets the short list only, and
			// an HTTP Basic challenge adds the admin's. It also tells a
			// method this server registers but does not implement
			// (requestAccountDelete: no email), which answers 501
			// MethodNotImplemented whatever the input: not a failure on
			// bad input.
			probe := sweepCase{name: "probe", verb: verb}
			if verb == http.MethodPost {
				probe.body, probe.ctype = []byte("{}"), "application/json"
			}
			status, header, body := probeAnswer(sw, nsid, nil, probe)
			unimplemented := status == http.StatusNotImplemented && errorName(body) == "MethodNotImplemented"
			modes := []sweepMode{
				{"unauthenticated", nil},
				{"user", http.Header{"Authorization": {"Bearer " + fx.user.access}}},
			}
			if strings.Contains(nsid, ".admin.") || status == http.StatusUnauthorized && strings.Contains(header.Get("WWW-Authenticate"), "Basic") {
				modes = append(modes, sweepMode{"admin", admin})
			}
			var problems []string
			complain := func(mode string, c sweepCase, what string) {
				problems = append(problems, fmt.Sprintf("%s %s [%s] %s: %s", c.verb, nsid, mode, c.name, what))
			}
			for _, mode := range modes {
				status, _, _ := probeAnswer(sw, nsid, mode.auth, probe)
				full := status != http.StatusUnauthorized
				for _, c := range cases(full) {
					if what := sw.send(nsid, mode.auth, c, unimplemented); what != "" {
						complain(mode.name, c, what)
					}
				}
			}
			for _, c := range authCases(verb, schema) {
				if what := sw.send(nsid, nil, c, unimplemented); what != "" {
					complain("bad credentials", c, what)
				}
			}
			if nsid == "com.atproto.sync.subscribeRepos" {
				for _, what := range subscribeCases(t, sw) {
					problems = append(problems, "subscribeRepos: "+what)
				}
			}
			sw.mu.Lock()
			t.Logf("%s answers: %v", nsid, sw.answers[nsid])
			sw.mu.Unlock()
			for i, p := range problems {
				if i == 25 {
					t.Errorf("... and %d more", len(problems)-i)
					break
				}
				t.Error(p)
			}
		})
	}
	t.Run("unknown paths", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/xrpc/", "/xrpc/" + strings.Repeat("a", 3000), "/xrpc/../..", "/xrpc/%00", "/xrpc/com.atproto.repo.getRecord/extra", "/xrpc/_health/../_health"} {
			req, err := http.NewRequest(http.MethodGet, env.url, nil)
			require.NoError(t, err)
			req.URL.Opaque = path
			resp, err := sw.client.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// An unknown method is 501 MethodNotImplemented, as XRPC
			// specifies.
			if what := sw.judge("", sweepCase{}, resp, b, true); what != "" {
				t.Errorf("GET %s: %s", truncate(path, 40), what)
			}
		}
	})
	t.Run("odd records read back", func(t *testing.T) {
		t.Parallel()
		storedOddities(t, env, sw)
	})
	t.Cleanup(func() {
		t.Logf("bad-input sweep: %d methods, %d requests in %v", len(methods), sw.count.Load(), time.Since(start).Round(time.Millisecond))
		// Nothing failed, so nothing is logged as a failure: not the
		// refusals, and not the 501s of unimplemented methods either.
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "level=ERROR") {
				t.Errorf("logged as a failure: %s", truncate(strings.TrimSpace(line), 500))
			}
		}
	})
}

// probeAnswer sends probe and returns the answer (status 0: none).
func probeAnswer(sw *sweeper, nsid string, auth http.Header, probe sweepCase) (int, http.Header, []byte) {
	var body io.Reader
	if probe.body != nil {
		body = bytes.NewReader(probe.body)
	}
	req, err := http.NewRequest(probe.verb, sw.env.url+"/xrpc/"+nsid, body)
	if err != nil {
		return 0, nil, nil
	}
	if probe.ctype != "" {
		req.Header.Set("Content-Type", probe.ctype)
	}
	for k, vs := range auth {
		req.Header[k] = vs
	}
	resp, err := sw.client.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// subscribeCases are subscribeRepos' WebSocket handshakes: a bad cursor is
// refused before the upgrade, with the XRPC error shape, and a botched
// handshake gets an XRPC error too.
func subscribeCases(t *testing.T, sw *sweeper) []string {
	t.Helper()
	wsURL := "ws" + strings.TrimPrefix(sw.env.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	var problems []string
	for _, cursor := range []string{"-5", "abc", "1.5", "9223372036854775808", "%00", strings.Repeat("9", 3000)} {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL+"?cursor="+url.QueryEscape(cursor), nil)
		if err == nil {
			conn.Close()
			problems = append(problems, fmt.Sprintf("cursor=%s: upgraded", truncate(cursor, 20)))
			continue
		}
		if resp == nil {
			problems = append(problems, fmt.Sprintf("cursor=%s: no answer (%v)", truncate(cursor, 20), err))
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if what := sw.judge("", sweepCase{}, resp, b, false); what != "" {
			problems = append(problems, fmt.Sprintf("cursor=%s: %s", truncate(cursor, 20), what))
		} else if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusTooManyRequests {
			problems = append(problems, fmt.Sprintf("cursor=%s: status %d, want 400 (or 429)", truncate(cursor, 20), resp.StatusCode))
		}
	}
	// A future cursor and a valid one are accepted; the connection is
	// closed at once.
	for _, cursor := range []string{"0", "99999999999"} {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL+"?cursor="+cursor, nil)
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			if status != http.StatusTooManyRequests {
				problems = append(problems, fmt.Sprintf("cursor=%s: %v (status %d)", cursor, err, status))
			}
			continue
		}
		conn.Close()
	}
	// Half a WebSocket handshake: the upgrade headers without a key, or
	// with a version nobody speaks.
	for name, h := range map[string]http.Header{
		"no key":      {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}},
		"version 12":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"12"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"no version":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"bad cursor":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"upgrade h2c": {"Connection": {"Upgrade"}, "Upgrade": {"h2c"}},
	} {
		c := sweepCase{name: "handshake " + name, verb: http.MethodGet, header: h}
		if name == "bad cursor" {
			c.query = "cursor=-5"
		}
		if what := sw.send("com.atproto.sync.subscribeRepos", nil, c, false); what != "" {
			problems = append(problems, c.name+": "+what)
		}
	}
	return problems
}

// storedOddities writes records that are unusual but valid atproto data
// (so the write may succeed) and reads each back through every method that
// serves records: what one request stored must not make another a 500.
func storedOddities(t *testing.T, env *accountEnv, sw *sweeper) {
	u := env.createUser(t)
	did := u.did.String()
	const coll = "com.example.oddity"
	for label, extra := range map[string]string{
		"9000 nested arrays":       `"deep":` + nested(9000, false),
		"9000 nested objects":      `"deep":` + nested(9000, true),
		"empty $bytes":             `"b":{"$bytes":""}`,
		"empty $bytes in an array": `"b":[{"$bytes":""},{"$bytes":"AQID"}]`,
		"$link":                    `"l":{"$link":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}`,
		"NUL in key and value":     `"k\u0000":"v\u0000"`,
		"empty key":                `"":""`,
		"empty containers":         `"m":{},"a":[],"s":""`,
		"min int64":                `"n":-9223372036854775808`,
		"unicode":                  `"ünï☃🦋":"\ud83e\udd8b"`,
		"100 KB string":            `"s":"` + strings.Repeat("x", 100<<10) + `"`,
	} {
		body := `{"repo":"` + did + `","collection":"` + coll + `","validate":false,"record":{"$type":"` + coll + `",` + extra + `}}`
		res := env.post(t, "com.atproto.repo.createRecord", u.access, []byte(body))
		if res.status != http.StatusOK {
			if what := sw.judge("", sweepCase{}, &http.Response{StatusCode: res.status, Header: res.header}, res.body, false); what != "" {
				t.Errorf("createRecord %s: %s", label, what)
			}
			continue
		}
		var out struct{ URI, CID string }
		require.NoError(t, json.Unmarshal(res.body, &out))
		rkey := out.URI[strings.LastIndex(out.URI, "/")+1:]
		for _, read := range []struct {
			nsid string
			q    url.Values
		}{
			{"com.atproto.repo.getRecord", url.Values{"repo": {did}, "collection": {coll}, "rkey": {rkey}}},
			{"com.atproto.repo.getRecord", url.Values{"repo": {did}, "collection": {coll}, "rkey": {rkey}, "cid": {out.CID}}},
			{"com.atproto.repo.listRecords", url.Values{"repo": {did}, "collection": {coll}}},
			{"com.atproto.repo.listRecords", url.Values{"repo": {did}, "collection": {coll}, "reverse": {"true"}, "limit": {"1"}}},
			{"com.atproto.repo.describeRepo", url.Values{"repo": {did}}},
			{"com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {coll}, "rkey": {rkey}}},
			{"com.atproto.sync.getBlocks", url.Values{"did": {did}, "cids": {out.CID}}},
			{"com.atproto.sync.getRepo", url.Values{"did": {did}}},
		} {
			c := sweepCase{name: label, verb: http.MethodGet, query: read.q.Encode()}
			if what := sw.send(read.nsid, nil, c, false); what != "" {
				t.Errorf("%s after a record with %s: %s", read.nsid, label, what)
			}
		}
	}
}
