package proxy

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

func TestParseHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		did, id string
		bad     bool
	}{
		{in: "did:web:api.bsky.app#bsky_appview", did: "did:web:api.bsky.app", id: "bsky_appview"},
		{in: "did:web:api.bsky.chat#bsky_chat", did: "did:web:api.bsky.chat", id: "bsky_chat"},
		{in: "did:plc:ar7c4by46qjdydhdevvrndac#atproto_labeler", did: "did:plc:ar7c4by46qjdydhdevvrndac", id: "atproto_labeler"},
		{in: "did:web:localhost%3A2584#bsky_appview", did: "did:web:localhost%3A2584", id: "bsky_appview"},
		{in: "did:web:api.bsky.app", bad: true},                // no '#'
		{in: "did:web:api.bsky.app#", bad: true},               // empty id
		{in: "#bsky_appview", bad: true},                       // no DID
		{in: "did:web:a#b#c", bad: true},                       // two '#'
		{in: "did:web:api.bsky.app #bsky_appview", bad: true},  // space
		{in: "did:web:api.bsky.app#bsky appview", bad: true},   // space in id
		{in: "did:web:api.bsky.app#bsky_appview\t", bad: true}, // tab
		{in: "not-a-did#bsky_appview", bad: true},              // invalid DID
		{in: "did:web:api.bsky.app#bsky/appview", bad: true},   // bad id character
		{in: "did:web:api.bsky.app#" + strings.Repeat("a", 129), bad: true},
		{in: "did:web:" + strings.Repeat("a", 2100) + "#x", bad: true}, // over MaxHeaderLength
		{in: "", bad: true},
	}
	for _, tc := range tests {
		did, id, err := ParseHeader(tc.in)
		if tc.bad {
			require.ErrorIs(t, err, ErrBadHeader, "%q", tc.in)
			var pe *Error
			require.ErrorAs(t, err, &pe)
			require.Equal(t, 400, pe.Status)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, syntax.DID(tc.did), did)
		require.Equal(t, tc.id, id)
	}
}

func TestTargetRouting(t *testing.T) {
	t.Parallel()
	res := &stubResolver{services: map[syntax.DID]map[string]string{
		chatDID:    {"bsky_chat": "https://chat.test"},
		modDID:     {"atproto_labeler": "https://mod.test"},
		appViewDID: {"bsky_notif": "https://notif.test"},
	}}
	full := Config{
		AppViewURL: "https://appview.test/", AppViewDID: appViewDID,
		ModerationURL: "https://mod.test", ModerationDID: modDID,
		ReportURL: "https://reports.test", ReportDID: reportDID,
		Resolver: res,
	}
	p, err := New(full)
	require.NoError(t, err)
	empty, err := New(Config{})
	require.NoError(t, err)

	tests := []struct {
		name   string
		p      *Proxy
		nsid   string
		header string
		want   Target
		err    error
	}{
		{"app view by default", p, "app.bsky.feed.getTimeline", "", Target{"https://appview.test", appViewDID, "bsky_appview", true}, nil},
		{"unknown namespace to app view", p, "com.example.thing", "", Target{"https://appview.test", appViewDID, "bsky_appview", true}, nil},
		{"ozone to moderation", p, "tools.ozone.moderation.queryStatuses", "", Target{"https://mod.test", modDID, "atproto_labeler", true}, nil},
		{"report to report service", p, "com.atproto.moderation.createReport", "", Target{"https://reports.test", reportDID, "atproto_labeler", true}, nil},
		{"header naming the app view", p, "app.bsky.feed.getTimeline", "did:web:appview.test#bsky_appview", Target{"https://appview.test", appViewDID, "bsky_appview", true}, nil},
		{"header naming the moderation service", p, "com.atproto.moderation.createReport", "did:plc:moderation0000000000000#atproto_labeler", Target{"https://mod.test", modDID, "atproto_labeler", true}, nil},
		{"header naming chat", p, "chat.bsky.convo.listConvos", "did:web:chat.test#bsky_chat", Target{"https://chat.test", chatDID, "bsky_chat", false}, nil},
		{"app view DID, other service", p, "app.bsky.notification.registerPush", "did:web:appview.test#bsky_notif", Target{"https://notif.test", appViewDID, "bsky_notif", false}, nil},
		{"unknown DID", p, "chat.bsky.convo.listConvos", "did:web:nobody.test#bsky_chat", Target{}, ErrUnknownDID},
		{"unknown service", p, "chat.bsky.convo.listConvos", "did:web:chat.test#bsky_nope", Target{}, ErrUnknownService},
		{"bad header", p, "chat.bsky.convo.listConvos", "did:web:chat.test", Target{}, ErrBadHeader},
		{"nothing configured", empty, "app.bsky.feed.getTimeline", "", Target{}, ErrNotConfigured},
		{"no moderation configured", empty, "tools.ozone.team.listMembers", "", Target{}, ErrNotConfigured},
		{"header without resolver", empty, "chat.bsky.convo.listConvos", "did:web:chat.test#bsky_chat", Target{}, ErrUnknownDID},
	}
	for _, tc := range tests {
		got, err := tc.p.Target(context.Background(), syntax.NSID(tc.nsid), tc.header)
		if tc.err != nil {
			require.ErrorIs(t, err, tc.err, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
	var pe *Error
	_, err = empty.Target(context.Background(), "app.bsky.feed.getTimeline", "")
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 501, pe.Status)
	require.Contains(t, pe.Message, "app.bsky.feed.getTimeline")
	_, err = p.Target(context.Background(), "chat.bsky.convo.listConvos", "did:web:nobody.test#bsky_chat")
	require.ErrorAs(t, err, &pe)
	require.Contains(t, pe.Message, "did:web:nobody.test")
}

func TestNewRefusesBadServiceConfig(t *testing.T) {
	t.Parallel()
	_, err := New(Config{AppViewURL: "https://appview.test"})
	require.Error(t, err, "an app view without a DID")
	_, err = New(Config{AppViewURL: "ftp://appview.test", AppViewDID: appViewDID})
	require.Error(t, err)
}

// docSource serves DID documents and counts fetches.
type docSource struct {
	docs  map[syntax.DID]*identity.DIDDocument
	err   error
	calls atomic.Int64
}

func (s *docSource) ResolveDID(_ context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	s.calls.Add(1)
	if s.err != nil {
		return nil, s.err
	}
	doc, ok := s.docs[did]
	if !ok {
		return nil, identity.ErrDIDNotFound
	}
	return doc, nil
}

func TestDocResolver(t *testing.T) {
	t.Parallel()
	src := &docSource{docs: map[syntax.DID]*identity.DIDDocument{
		chatDID: {DID: chatDID, Service: []identity.DocService{
			{ID: "#bsky_chat", Type: "BskyChatService", ServiceEndpoint: "https://chat.test/some/path"},
			{ID: "did:web:chat.test#bsky_notif", ServiceEndpoint: "https://notif.test"},
			{ID: "did:web:other.test#bsky_fg", ServiceEndpoint: "https://evil.test"},
			{ID: "#plain", ServiceEndpoint: "http://plain.test"},
			{ID: "#creds", ServiceEndpoint: "https://user:pw@creds.test"},
		}},
	}}
	r := NewDocResolver(src, ResolverConfig{})
	now := time.Unix(1_700_000_000, 0)
	r.now = func() time.Time { return now }
	ctx := context.Background()

	u, err := r.ResolveService(ctx, chatDID, "bsky_chat")
	require.NoError(t, err)
	require.Equal(t, "https://chat.test", u)
	u, err = r.ResolveService(ctx, chatDID, "bsky_notif")
	require.NoError(t, err, "the absolute did#id form")
	require.Equal(t, "https://notif.test", u)
	_, err = r.ResolveService(ctx, chatDID, "bsky_fg")
	require.ErrorIs(t, err, ErrUnknownService, "an id owned by another DID")
	_, err = r.ResolveService(ctx, chatDID, "plain")
	require.ErrorIs(t, err, ErrUnknownService, "http endpoints only with AllowHTTP")
	_, err = r.ResolveService(ctx, chatDID, "creds")
	require.ErrorIs(t, err, ErrUnknownService)
	require.EqualValues(t, 1, src.calls.Load(), "one fetch, then the cache")

	_, err = r.ResolveService(ctx, "did:web:nobody.test", "bsky_chat")
	require.ErrorIs(t, err, ErrUnknownDID)
	_, err = r.ResolveService(ctx, "did:web:nobody.test", "bsky_chat")
	require.ErrorIs(t, err, ErrUnknownDID)
	require.EqualValues(t, 2, src.calls.Load(), "not-found is cached")

	now = now.Add(DefaultResolverNegativeTTL + time.Second)
	_, _ = r.ResolveService(ctx, "did:web:nobody.test", "bsky_chat")
	_, _ = r.ResolveService(ctx, chatDID, "bsky_chat")
	require.EqualValues(t, 3, src.calls.Load(), "negative entry expired, positive still fresh")
	now = now.Add(DefaultResolverTTL)
	_, _ = r.ResolveService(ctx, chatDID, "bsky_chat")
	require.EqualValues(t, 4, src.calls.Load(), "positive entry expired")

	lax := NewDocResolver(src, ResolverConfig{AllowHTTP: true})
	u, err = lax.ResolveService(ctx, chatDID, "plain")
	require.NoError(t, err)
	require.Equal(t, "http://plain.test", u)
}

func TestDocResolverFailures(t *testing.T) {
	t.Parallel()
	src := &docSource{err: errors.New("directory unreachable")}
	r := NewDocResolver(src, ResolverConfig{})
	ctx := context.Background()
	_, err := r.ResolveService(ctx, chatDID, "bsky_chat")
	require.ErrorIs(t, err, ErrResolution)
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 502, pe.Status)
	_, _ = r.ResolveService(ctx, chatDID, "bsky_chat")
	require.EqualValues(t, 2, src.calls.Load(), "transient failures are not cached")

	// A document for another DID does not count.
	src = &docSource{docs: map[syntax.DID]*identity.DIDDocument{chatDID: {DID: "did:web:else.test"}}}
	_, err = NewDocResolver(src, ResolverConfig{}).ResolveService(ctx, chatDID, "bsky_chat")
	require.ErrorIs(t, err, ErrUnknownDID)
}

func TestDocResolverBounded(t *testing.T) {
	t.Parallel()
	src := &docSource{docs: map[syntax.DID]*identity.DIDDocument{}}
	dids := []syntax.DID{"did:web:a.test", "did:web:b.test", "did:web:c.test"}
	for _, d := range dids {
		src.docs[d] = &identity.DIDDocument{DID: d, Service: []identity.DocService{{ID: "#s", ServiceEndpoint: "https://x.test"}}}
	}
	r := NewDocResolver(src, ResolverConfig{Size: 2})
	ctx := context.Background()
	for _, d := range dids {
		_, err := r.ResolveService(ctx, d, "s")
		require.NoError(t, err)
	}
	require.Equal(t, 2, r.cache.Len())
	_, _ = r.ResolveService(ctx, dids[0], "s")
	require.EqualValues(t, 4, src.calls.Load(), "the oldest entry was evicted")

	// MockDirectory works as a source, and so does a Directory.
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: chatDID, Handle: syntax.HandleInvalid,
		Services: map[string]identity.ServiceEndpoint{"bsky_chat": {URL: "https://chat.test"}}})
	for _, s := range []DocumentSource{dir, DirectorySource{Dir: dir}} {
		u, err := NewDocResolver(s, ResolverConfig{}).ResolveService(ctx, chatDID, "bsky_chat")
		require.NoError(t, err)
		require.Equal(t, "https://chat.test", u)
	}
}
