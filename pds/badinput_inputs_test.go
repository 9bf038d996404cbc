package pds

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The bad-input sweep's raw material (badinput_test.go): the lexicon
// shapes of the methods, and the malformed values and bodies it sends.

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
	AdminNSIDPrefix + "getPendingEmailTokens": {params: map[string]lexProp{
		"account": {Type: "string", Format: "at-identifier"},
	}},
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
	AdminNSIDPrefix + "importRepo": {encoding: "application/vnd.ipld.car", params: map[string]lexProp{
		"did": {Type: "string", Format: "did"}, "reason": {Type: "string"},
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
