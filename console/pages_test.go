package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// identities appends n #identity events and waits until they have seqs;
// it returns the last one.
func (e *env) identities(t *testing.T, n int) int64 {
	t.Helper()
	ctx := context.Background()
	start := e.lastSeq(t)
	for i := range n {
		enc, err := eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{
			Did: fmt.Sprintf("did:plc:identity%020d", i), Time: syntax.DatetimeNow().String(),
		})
		require.NoError(t, err)
		require.NoError(t, eventlog.Append(ctx, e.pool, enc))
	}
	e.seq.Wake()
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	return e.seqs.wait(t, wctx, start+int64(n))
}

var eventRowRE = regexp.MustCompile(`<td><a href="/admin/firehose/event/(\d+)">`)

// rows are the seqs of a firehose page's rows, in order.
func (p page) rows(t *testing.T) []int64 {
	t.Helper()
	var out []int64
	for _, m := range eventRowRE.FindAllStringSubmatch(p.body, -1) {
		n, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		out = append(out, n)
	}
	return out
}

var pagingRE = regexp.MustCompile(`<a href="(/admin/firehose\?[^"]+)">(Older|Newer) events</a>`)

// link is the href of p's "Older events" or "Newer events" link.
func (p page) link(which string) string {
	for _, m := range pagingRE.FindAllStringSubmatch(p.body, -1) {
		if m[2] == which {
			return regexp.MustCompile(`&amp;`).ReplaceAllString(m[1], "&")
		}
	}
	return ""
}

func descending(from int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from - int64(i)
	}
	return out
}

// The firehose page starts at the newest event, newest first, and pages
// back and forth a hundred at a time.
func TestFirehoseNewestFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	head := e.identities(t, 150)
	b := e.browser(t)
	b.mustLogin()

	first := b.get(console.Prefix + "firehose")
	require.Equal(t, http.StatusOK, first.status, first.body)
	require.Equal(t, descending(head, 100), first.rows(t))
	require.Empty(t, first.link("Newer"), "nothing is newer than the head")
	older := first.link("Older")
	require.Equal(t, fmt.Sprintf("/admin/firehose?to=%d", head-100), older)

	second := b.get(older)
	require.Equal(t, descending(head-100, int(head-100)), second.rows(t), "down to seq 1")
	require.Empty(t, second.link("Older"), "seq 1 is the oldest")
	back := b.get(second.link("Newer"))
	require.Equal(t, descending(head, 100), back.rows(t))

	// Filters keep the order and carry over to the paging links.
	filtered := b.get(console.Prefix + "firehose?kind=identity&to=" + strconv.FormatInt(head-10, 10))
	require.Equal(t, descending(head-10, 100), filtered.rows(t))
	require.Contains(t, filtered.link("Older"), "kind=identity")
	require.Contains(t, filtered.link("Newer"), "kind=identity")
}

// An event's page shows a commit's operations: action, path and CIDs.
func TestEventShowsOps(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	did, seq := e.newRepo(t, "opal.test")
	ops, err := e.log.Ops(context.Background(), seq)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	b := e.browser(t)
	b.mustLogin()
	p := b.get(fmt.Sprintf("%sfirehose/event/%d", console.Prefix, seq))
	require.Equal(t, http.StatusOK, p.status, p.body)
	require.Contains(t, p.body, "<h2>Operations</h2>")
	require.Contains(t, p.body, "<td>create</td>")
	require.Contains(t, p.body, "<td>"+ops[0].Path+"</td>")
	require.Contains(t, p.body, "app.bsky.feed.post/")
	require.Contains(t, p.body, "<code>"+ops[0].CID+"</code>")
	// An #identity has no operations to show.
	evs, err := e.log.Inspect(context.Background(), eventlog.EventFilter{DID: did.String(), Kind: eventlog.KindIdentity, Limit: 1})
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	p = b.get(fmt.Sprintf("%sfirehose/event/%d", console.Prefix, evs[0].Seq))
	require.Equal(t, http.StatusOK, p.status, p.body)
	require.NotContains(t, p.body, "<h2>Operations</h2>")
}

// The login page says where the admin password is, never what it is.
func TestLoginPageSaysWhereThePasswordIs(t *testing.T) {
	t.Parallel()
	file := "/var/lib/bulwark/secrets/admin-password"
	for _, tc := range []struct {
		file string
		says string
	}{
		{file, "The admin password is in <code>" + file + "</code> on the server"},
		{"", "The admin password is the server's <code>BULWARK_ADMIN_PASSWORD</code> setting"},
	} {
		e := newEnv(t, envOptions{passwordFile: tc.file})
		p := e.browser(t).get(console.Prefix + "login")
		require.Equal(t, http.StatusOK, p.status)
		require.Contains(t, p.body, tc.says)
		require.NotContains(t, p.body, adminPassword)
	}
}
