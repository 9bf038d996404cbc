package main

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Inputs for sweeping XRPC methods from outside (the route-table and
// state-growth tests, the sweep of a running binary): for each method, the
// parameters or body its lexicon describes, filled with plausible values
// (an existing account's, or fresh ones a sign-up would use) and with
// junk. Methods without a lexicon (Bulwark's own) get a generic set.

// lexField is one parameter or body field of a lexicon.
type lexField struct {
	Type   string    `json:"type"`
	Format string    `json:"format"`
	Items  *lexField `json:"items"`
}

// lexObject is a lexicon's params or input schema.
type lexObject struct {
	Required   []string            `json:"required"`
	Properties map[string]lexField `json:"properties"`
}

// lexMethod is what the sweeps need of a method's lexicon.
type lexMethod struct {
	Params   lexObject
	Encoding string // "" when the method takes no body
	Body     lexObject
}

// lexiconDir holds the com.atproto and app.bsky lexicons the PDS embeds.
const lexiconDir = "../../pds/lexicons"

// loadLexicons reads every method's lexicon under lexiconDir, by NSID.
func loadLexicons(t *testing.T) map[string]lexMethod {
	t.Helper()
	out := map[string]lexMethod{}
	err := filepath.WalkDir(lexiconDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var doc struct {
			ID   string `json:"id"`
			Defs struct {
				Main struct {
					Type       string    `json:"type"`
					Parameters lexObject `json:"parameters"`
					Input      *struct {
						Encoding string    `json:"encoding"`
						Schema   lexObject `json:"schema"`
					} `json:"input"`
				} `json:"main"`
			} `json:"defs"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return err
		}
		m := doc.Defs.Main
		if m.Type != "query" && m.Type != "procedure" && m.Type != "subscription" {
			return nil
		}
		lm := lexMethod{Params: m.Parameters}
		if m.Input != nil {
			lm.Encoding, lm.Body = m.Input.Encoding, m.Input.Schema
		}
		out[doc.ID] = lm
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, out, "com.atproto.server.createAccount")
	return out
}

// genericMethod stands in for a method without a lexicon: the names most
// methods take.
var genericMethod = lexMethod{
	Params: lexObject{Properties: map[string]lexField{
		"did": {Type: "string", Format: "did"}, "repo": {Type: "string", Format: "at-identifier"},
		"limit": {Type: "integer"}, "cursor": {Type: "string"}, "seq": {Type: "integer"},
	}},
	Encoding: "application/json",
	Body: lexObject{Properties: map[string]lexField{
		"did": {Type: "string", Format: "did"}, "seq": {Type: "integer"}, "reason": {Type: "string"},
		"relay": {Type: "string"}, "floor": {Type: "integer"},
	}},
}

// inputAccount is the existing account plausible inputs refer to.
type inputAccount struct {
	did, handle, email, password string
	// domain is the server's handle domain (".test"), for fresh handles.
	domain string
}

// freshSeq makes fresh names unique within the test binary.
var freshSeq atomic.Int64

// xrpcInput is one request to a method: its query string, or its body
// and content type.
type xrpcInput struct {
	name   string
	query  string
	body   []byte
	ctype  string
	isBody bool
}

// plausibleInputs are the method's inputs with valid-looking values: one
// about the existing account, one with fresh names (what a sign-up sends).
func plausibleInputs(m lexMethod, procedure bool, acct inputAccount) []xrpcInput {
	existing := func(name string, f lexField) any { return plausibleValue(name, f, acct, false) }
	fresh := func(name string, f lexField) any { return plausibleValue(name, f, acct, true) }
	if !procedure {
		return []xrpcInput{
			{name: "plausible", query: queryOf(m.Params, existing, false)},
			{name: "plausible, required only", query: queryOf(m.Params, existing, true)},
		}
	}
	if m.Encoding != "application/json" {
		return []xrpcInput{{name: "plausible bytes", query: queryOf(m.Params, existing, true), body: pngBytes, ctype: "image/png", isBody: true}}
	}
	return []xrpcInput{
		{name: "plausible", query: queryOf(m.Params, existing, true), body: bodyOf(m.Body, existing, nil), ctype: "application/json", isBody: true},
		{name: "plausible, fresh names", query: queryOf(m.Params, existing, true), body: bodyOf(m.Body, fresh, []string{"email", "password"}), ctype: "application/json", isBody: true},
	}
}

// junkInputs are malformed inputs of the method: nothing, wrong types,
// broken bodies.
func junkInputs(m lexMethod, procedure bool) []xrpcInput {
	names := sortedFields(m.Params)
	wrong := url.Values{}
	long := url.Values{}
	for _, n := range names {
		wrong.Set(n, "-1.5e999")
		long.Set(n, strings.Repeat("\u00e9", 2000))
	}
	wrong.Set("zz-unknown", "1")
	out := []xrpcInput{
		{name: "no parameters"},
		{name: "wrong parameters", query: wrong.Encode()},
		{name: "long parameters", query: long.Encode()},
		{name: "broken query", query: "%zz=%ff&" + strings.Join(names, "&")},
	}
	if !procedure {
		return out
	}
	typed := map[string]any{}
	for _, n := range sortedFields(m.Body) {
		typed[n] = map[string]any{"$type": 12345}
	}
	typedJSON, _ := json.Marshal(typed)
	return append(out,
		xrpcInput{name: "empty body", isBody: true, ctype: "application/json"},
		xrpcInput{name: "not JSON", isBody: true, body: []byte("{\"a\":"), ctype: "application/json"},
		xrpcInput{name: "JSON of wrong types", isBody: true, body: typedJSON, ctype: "application/json"},
		xrpcInput{name: "JSON array", isBody: true, body: []byte("[1,2,3]"), ctype: "application/json"},
		xrpcInput{name: "wrong content type", isBody: true, body: []byte("{}"), ctype: "text/plain"},
		xrpcInput{name: "bytes", isBody: true, body: []byte{0xff, 0x00, 0x89}, ctype: "application/octet-stream"},
	)
}

func sortedFields(o lexObject) []string {
	out := make([]string, 0, len(o.Properties))
	for n := range o.Properties {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// queryOf is the query string of o's parameters (the required ones only,
// when requiredOnly), valued by value.
func queryOf(o lexObject, value func(string, lexField) any, requiredOnly bool) string {
	q := url.Values{}
	for _, n := range sortedFields(o) {
		if requiredOnly && !contains(o.Required, n) {
			continue
		}
		switch v := value(n, o.Properties[n]).(type) {
		case []any:
			for _, item := range v {
				q.Add(n, toParam(item))
			}
		default:
			q.Set(n, toParam(v))
		}
	}
	return q.Encode()
}

func toParam(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case bool:
		return strconv.FormatBool(v)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// bodyOf is a JSON body of o's fields: all of them when also is nil, else
// the required ones and also.
func bodyOf(o lexObject, value func(string, lexField) any, also []string) []byte {
	body := map[string]any{}
	for _, n := range sortedFields(o) {
		if also != nil && !contains(o.Required, n) && !contains(also, n) {
			continue
		}
		body[n] = value(n, o.Properties[n])
	}
	b, _ := json.Marshal(body)
	return b
}

// plausibleValue is a valid-looking value of field name: the existing
// account's, or, fresh, new names a sign-up would choose.
func plausibleValue(name string, f lexField, acct inputAccount, fresh bool) any {
	n := strconv.FormatInt(freshSeq.Add(1), 36)
	switch name {
	case "email":
		if fresh {
			return "fresh" + n + "@example.com"
		}
		return acct.email
	case "password":
		if fresh {
			return "fresh-password-" + n
		}
		return acct.password
	case "identifier":
		return acct.handle
	case "handle":
		if fresh {
			return "fresh" + n + acct.domain
		}
		return acct.handle
	case "collection":
		return "app.bsky.feed.post"
	case "record":
		return map[string]any{"$type": "app.bsky.feed.post", "text": "plausible", "createdAt": time.Now().UTC().Format(time.RFC3339)}
	case "name":
		return "sweep-" + n
	}
	switch f.Format {
	case "did":
		return acct.did
	case "handle":
		return acct.handle
	case "at-identifier":
		return acct.did
	case "nsid":
		return "app.bsky.feed.post"
	case "record-key":
		return "self"
	case "cid":
		return "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	case "at-uri":
		return "at://" + acct.did + "/app.bsky.feed.post/3jzfcijpj2z2a"
	case "datetime":
		return time.Now().UTC().Format(time.RFC3339)
	case "uri":
		return "https://example.com/"
	case "tid":
		return "3jzfcijpj2z2a"
	case "language":
		return "en"
	}
	switch f.Type {
	case "integer":
		return 1
	case "boolean":
		return true
	case "array":
		item := lexField{Type: "string"}
		if f.Items != nil {
			item = *f.Items
		}
		return []any{plausibleValue("", item, acct, fresh)}
	case "unknown", "object", "ref", "union", "blob":
		return map[string]any{}
	case "bytes":
		return map[string]any{"$bytes": "AQID"}
	}
	return "plausible"
}

// pngBytes is a tiny PNG, a plausible blob.
var pngBytes = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89" +
	"\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")

// newRequest is the request of in to nsid (verb by procedure) at base.
func (in xrpcInput) newRequest(base, nsid string, procedure bool) (*http.Request, error) {
	verb := http.MethodGet
	if procedure {
		verb = http.MethodPost
	}
	u := base + "/xrpc/" + nsid
	var req *http.Request
	var err error
	if in.isBody {
		req, err = http.NewRequest(verb, u, strings.NewReader(string(in.body)))
	} else {
		req, err = http.NewRequest(verb, u, nil)
	}
	if err != nil {
		return nil, err
	}
	// Set raw: a broken query must reach the server as it is.
	req.URL.RawQuery = in.query
	if in.ctype != "" {
		req.Header.Set("Content-Type", in.ctype)
	}
	return req, nil
}
