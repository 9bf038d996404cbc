package oauth_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// push sends a pushed request for scope (which c's metadata declares).
func push(c *rawClient, scope string) answer {
	form := c.parForm()
	form.Set("scope", scope)
	return c.post(oauth.PathPAR, form.Encode(), c.proof(oauth.PathPAR))
}

// TestPermissionSetRefusals: a set that cannot be resolved, or is not a
// usable permission set, fails the pushed request with invalid_scope in
// fixed words; the failure is remembered for a while (one resolution for
// many requests); requests naming too many sets, or sets granting too
// much, are refused too.
func TestPermissionSetRefusals(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	lx.publishRaw(t, "com.example.authRecord", map[string]any{"lexicon": 1, "id": "com.example.authRecord",
		"defs": map[string]any{"main": map[string]any{"type": "record"}}})
	lx.publishRaw(t, "com.example.authHuge", map[string]any{"lexicon": 1, "id": "com.example.authHuge",
		"defs": map[string]any{"main": map[string]any{"type": "permission-set", "title": strings.Repeat("x", oauth.MaxSetDocumentBytes)}}})
	lx.publishRaw(t, "com.example.authOther", map[string]any{"lexicon": 1, "id": "com.example.authElse",
		"defs": map[string]any{"main": map[string]any{"type": "permission-set"}}})
	var many []map[string]any
	for i := range 65 {
		many = append(many, repoPerm(nil, fmt.Sprintf("com.example.r%d", i)))
	}
	lx.publish(t, "com.example.authMany", "Many", many...)
	// Nine sets, each granting 256 methods with long names: over
	// MaxTokenScopeLen together.
	var big []string
	for i := range 9 {
		nsid := fmt.Sprintf("com.example.big%d.authAll", i)
		var lxm []string
		for j := range 256 {
			lxm = append(lxm, fmt.Sprintf("com.example.big%d.method%03dWithAVeryLongNameIndeed", i, j))
		}
		lx.publish(t, nsid, "Big", rpcPerm("*", false, lxm...))
		big = append(big, "include:"+nsid)
	}
	lx.setFail("com.example.authDown", errors.New("dial tcp 10.0.0.7:443: connection refused"))
	f := setupSets(t, lx)
	declared := []string{"atproto", "include:com.example.authNowhere", "include:com.example.authDown", "include:com.example.authRecord",
		"include:com.example.authHuge", "include:com.example.authOther", "include:com.example.authMany",
		"include:com.example.authX?aud=*"}
	c := f.rawClient("refusals", strings.Join(append(declared, big...), " "))

	for _, tt := range []struct{ scope, desc string }{
		{"atproto include:com.example.authNowhere", "the permission set com.example.authNowhere could not be resolved"},
		{"atproto include:com.example.authDown", "the permission set com.example.authDown could not be resolved"},
		{"atproto include:com.example.authRecord", "com.example.authRecord is not a usable permission set"},
		{"atproto include:com.example.authHuge", "com.example.authHuge is not a usable permission set"},
		{"atproto include:com.example.authOther", "com.example.authOther is not a usable permission set"},
		{"atproto include:com.example.authMany", "com.example.authMany is not a usable permission set"},
		{"atproto " + strings.Join(big[:8], " ") + " include:com.example.authNowhere", "more than 8 permission sets"},
		{"atproto " + strings.Join(big[:8], " "), "the permission sets grant more than"},
	} {
		a := push(c, tt.scope)
		require.Equal(t, http.StatusBadRequest, a.status, tt.scope)
		require.Equal(t, oauth.CodeInvalidScope, a.str("error"), tt.scope)
		require.Contains(t, a.str("error_description"), tt.desc)
		require.NotContains(t, a.str("error_description"), "10.0.0.7", "what the resolution met stays in the log")
	}
	// The failures are remembered: asking again resolves nothing.
	for range 3 {
		require.Equal(t, oauth.CodeInvalidScope, push(c, "atproto include:com.example.authNowhere").str("error"))
	}
	require.Equal(t, 1, lx.count("com.example.authNowhere"))
	// ... until they are old enough to try again.
	f.oauth.AgeSets(oauth.SetFailureTTL)
	push(c, "atproto include:com.example.authNowhere")
	require.Equal(t, 2, lx.count("com.example.authNowhere"))

	// An include whose aud is not a service reference is not understood,
	// so not granted: the request is for atproto alone.
	a := push(c, "atproto include:com.example.authX?aud=*")
	require.Equal(t, http.StatusCreated, a.status, a.body)
	require.Zero(t, lx.count("com.example.authX"))
}

// TestPermissionSetResolutionsShared: concurrent requests for one set
// share one resolution; while maxSetResolutions distinct sets are being
// resolved, a request for another is refused 503 with Retry-After instead
// of waiting; the cache stays within its bounds however many sets are
// named.
func TestPermissionSetResolutionsShared(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	lx.gate, lx.entered = make(chan struct{}), make(chan syntax.NSID, 1000)
	f := setupSets(t, lx)
	var declared []string
	for i := range oauth.MaxSetResolutions + 1 {
		nsid := fmt.Sprintf("com.example.s%d.authSet", i)
		lx.publish(t, nsid, "S", repoPerm(nil, fmt.Sprintf("com.example.s%d.rec", i)))
		declared = append(declared, "include:"+nsid)
	}
	c := f.rawClient("shared", "atproto "+strings.Join(declared, " "))
	var wg sync.WaitGroup
	results := make(chan answer, 100)
	start := func(scope string) {
		// The form and proof are made here: the client is not safe for
		// concurrent use.
		form := c.parForm()
		form.Set("scope", scope)
		body, proof := form.Encode(), c.proof(oauth.PathPAR)
		wg.Add(1)
		go func() { defer wg.Done(); results <- c.post(oauth.PathPAR, body, proof) }()
	}
	// Three requests for the first set, one for each of the others but
	// the last: every resolution slot taken.
	for range 3 {
		start("atproto " + declared[0])
	}
	for i := 1; i < oauth.MaxSetResolutions; i++ {
		start("atproto " + declared[i])
	}
	seen := map[syntax.NSID]bool{}
	for len(seen) < oauth.MaxSetResolutions {
		seen[<-lx.entered] = true
	}
	a := push(c, "atproto "+declared[oauth.MaxSetResolutions])
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Equal(t, oauth.CodeUnavailable, a.str("error"))
	require.NotEmpty(t, a.header.Get("Retry-After"))
	close(lx.gate)
	wg.Wait()
	close(results)
	for a := range results {
		require.Equal(t, http.StatusCreated, a.status, a.body)
	}
	require.Equal(t, 1, lx.count("com.example.s0.authSet"), "three requests, one resolution")
}

// TestPermissionSetRefresh: a refresh picks up the set's newer version
// once the cached one is stale; when the set then cannot be resolved the
// session keeps what it has, and a new request still uses the set known
// for up to a day, after which it fails while the session goes on.
func TestPermissionSetRefresh(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	const nsid = "com.example.authNotes"
	lx.publish(t, nsid, "Notes v1", repoPerm([]string{"create"}, "com.example.note"))
	f := setupSets(t, lx)
	c := f.rawClient("notes", "atproto include:"+nsid)
	a := c.tokens()
	deleteNote := "check=repo&collection=com.example.note&action=delete"
	require.Equal(t, http.StatusForbidden, c.call(a.str("access_token"), c.key, deleteNote).StatusCode)

	lx.publish(t, nsid, "Notes v2", repoPerm(nil, "com.example.note"))
	a = c.refresh(a.str("refresh_token"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, http.StatusForbidden, c.call(a.str("access_token"), c.key, deleteNote).StatusCode, "the cached set is fresh")

	f.oauth.AgeSets(oauth.SetFreshFor)
	a = c.refresh(a.str("refresh_token"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "atproto repo:com.example.note", a.str("scope"))
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, deleteNote).StatusCode, "the newer set applies")

	lx.setFail(nsid, errors.New("server failure"))
	f.oauth.AgeSets(oauth.SetFreshFor)
	calls := lx.count(nsid)
	a = c.refresh(a.str("refresh_token"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, calls+1, lx.count(nsid), "tried again")
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, deleteNote).StatusCode, "the session keeps its permissions")
	require.Equal(t, http.StatusCreated, push(c, c.scope).status, "the set known is used for new requests for a day")

	f.oauth.AgeSets(oauth.SetUsableFor)
	require.Equal(t, oauth.CodeInvalidScope, push(c, c.scope).str("error"))
	a = c.refresh(a.str("refresh_token"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "atproto repo:com.example.note", a.str("scope"), "existing sessions are not affected")
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, deleteNote).StatusCode)
}

// TestPermissionSetWithoutResolver: a server without lexicon resolution
// refuses include: scopes, as before.
func TestPermissionSetWithoutResolver(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("nolex", "atproto include:com.example.authFull")
	a := push(c, c.scope)
	require.Equal(t, oauth.CodeInvalidScope, a.str("error"))
	require.Contains(t, a.str("error_description"), "not supported")
}
