package pds

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// referenceMethodsFile lists the XRPC methods the reference PDS serves
// itself, with the version they were read from (its header says how).
const referenceMethodsFile = "testdata/reference-pds-methods.txt"

// proxiedByDesign are the reference PDS's own methods that Bulwark leaves
// to its service proxy on purpose, each with why a client sees the same
// thing. Every other method of the reference list must be in the server's
// method table.
var proxiedByDesign = map[string]string{
	// The reference PDS's handlers for these proxy to the app view and
	// splice the caller's newest records in (read-after-write); Bulwark's
	// proxy does both for the same methods (package proxy, munge.go).
	"app.bsky.actor.getProfile":   "app view, with read-after-write in the proxy",
	"app.bsky.actor.getProfiles":  "app view, with read-after-write in the proxy",
	"app.bsky.feed.getActorLikes": "app view, with read-after-write in the proxy",
	"app.bsky.feed.getAuthorFeed": "app view, with read-after-write in the proxy",
	"app.bsky.feed.getPostThread": "app view, with read-after-write in the proxy",
	"app.bsky.feed.getTimeline":   "app view, with read-after-write in the proxy",
	"app.bsky.feed.getFeed":       "the proxy resolves the feed generator and signs for getFeedSkeleton, as the reference's handler does",
	"app.bsky.notification.registerPush": "the Bluesky app sends atproto-proxy: <service>#bsky_notif; the proxy signs " +
		"for that service, the aud the reference takes from the body's serviceDid",
	"app.bsky.notification.unregisterPush": "as registerPush",
	"com.atproto.moderation.createReport": "the proxy sends it to the report service (or the atproto-proxy " +
		"header's), with a service token, as the reference's handler does; a taken-down account may call it",
}

// readReferenceMethods reads the reference list: its version line and its
// NSIDs.
func readReferenceMethods(t *testing.T) (string, []string) {
	t.Helper()
	f, err := os.Open(referenceMethodsFile)
	require.NoError(t, err)
	defer f.Close()
	var version string
	var nsids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "version "):
			version = strings.TrimPrefix(line, "version ")
		default:
			nsids = append(nsids, line)
		}
	}
	require.NoError(t, sc.Err())
	return version, nsids
}

// TestReferenceMethodParity fails when the reference PDS serves a method
// that Bulwark neither serves nor deliberately leaves to its proxy (with a
// reason above): a client written against the reference must find every
// method it calls.
func TestReferenceMethodParity(t *testing.T) {
	t.Parallel()
	version, reference := readReferenceMethods(t)
	require.Equal(t, "@atproto/pds 0.5.35", version, "the list names the version it was read from")
	require.Greater(t, len(reference), 70, "the whole list, not a stub")
	env := badInputEnv(t, &lockedBuffer{})
	listed := map[string]bool{}
	var missing []string
	for _, nsid := range reference {
		listed[nsid] = true
		_, served := env.server.methods[nsid]
		reason, proxied := proxiedByDesign[nsid]
		switch {
		case served && proxied:
			t.Errorf("%s is served here but listed as proxied (%s): drop it from proxiedByDesign", nsid, reason)
		case !served && !proxied:
			missing = append(missing, nsid)
		}
	}
	require.Empty(t, missing, "methods the reference PDS (%s) serves that Bulwark neither serves nor proxies by design", version)
	for nsid := range proxiedByDesign {
		require.True(t, listed[nsid], "%s is listed as proxied by design but the reference does not serve it", nsid)
	}
}
