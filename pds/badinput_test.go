package pds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/oauth"
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
// added to the table is swept without touching these files.
//
// Not checked here: that a refused write left nothing behind (other tests
// compare row counts around their refusals), and the bodies of HEAD
// answers (there are none; only their status is).

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
		// OAuth on: every method also meets broken DPoP credentials.
		o.OAuth = &oauth.Config{Issuer: o.Config.PublicURL(), Secret: []byte(o.Config.JWTSecret)}
	}})
}

func TestBadInputNeverServerError(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	env := badInputEnv(t, logs)
	sw := &sweeper{env: env, logs: logs, client: &http.Client{Timeout: 30 * time.Second}, answers: map[string]map[string]int{}}

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
			problems := sweepMethod(t, sw, nsid, m)
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
		sweepUnknownPaths(t, sw)
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

// sweepMethod sends every case to nsid in every mode it takes and returns
// what was wrong with the answers.
func sweepMethod(t *testing.T, sw *sweeper, nsid string, m *method) []string {
	t.Helper()
	fx := newSweepFixture(t, sw.env)
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
	// A probe with no input tells which credentials the method wants: a
	// mode it answers 401 gets the short list only, and an HTTP Basic
	// challenge adds the admin's. It also tells a method this server
	// registers but does not implement, which answers 501
	// MethodNotImplemented whatever the input: not a failure on bad input.
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
		modes = append(modes, sweepMode{"admin", http.Header{"Authorization": {"Basic " + basic(AdminUser, testAdminPassword)}}})
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
	return problems
}

// sweepUnknownPaths: a path that is no method is 501 MethodNotImplemented,
// as XRPC specifies, whatever it holds.
func sweepUnknownPaths(t *testing.T, sw *sweeper) {
	for _, path := range []string{"/xrpc/", "/xrpc/" + strings.Repeat("a", 3000), "/xrpc/../..", "/xrpc/%00", "/xrpc/com.atproto.repo.getRecord/extra", "/xrpc/_health/../_health"} {
		req, err := http.NewRequest(http.MethodGet, sw.env.url, nil)
		require.NoError(t, err)
		req.URL.Opaque = path
		resp, err := sw.client.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if what := sw.judge("", sweepCase{}, resp, b, true); what != "" {
			t.Errorf("GET %s: %s", truncate(path, 40), what)
		}
	}
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
