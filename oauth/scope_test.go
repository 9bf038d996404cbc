package oauth_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

const appview = "did:web:api.bsky.app#bsky_appview"

func TestPermissions(t *testing.T) {
	t.Parallel()
	type check struct {
		what string
		ok   func(*oauth.Permissions) bool
		want bool
	}
	repo := func(c, a string) func(*oauth.Permissions) bool {
		return func(p *oauth.Permissions) bool { return p.CanRepo(c, a) }
	}
	blob := func(m string) func(*oauth.Permissions) bool {
		return func(p *oauth.Permissions) bool { return p.CanBlob(m) }
	}
	rpc := func(l, a string) func(*oauth.Permissions) bool {
		return func(p *oauth.Permissions) bool { return p.CanRPC(l, a) }
	}
	account := func(attr, act string) func(*oauth.Permissions) bool {
		return func(p *oauth.Permissions) bool { return p.CanAccount(attr, act) }
	}
	ident := func(attr string) func(*oauth.Permissions) bool {
		return func(p *oauth.Permissions) bool { return p.CanIdentity(attr) }
	}
	tests := map[string][]check{
		"atproto": {
			{"post", repo("app.bsky.feed.post", "create"), false},
			{"blob", blob("image/png"), false},
			{"timeline", rpc("app.bsky.feed.getTimeline", appview), false},
			{"email", account("email", "read"), false},
			{"handle", ident("handle"), false},
		},
		"atproto transition:generic": {
			{"post", repo("app.bsky.feed.post", "delete"), true},
			{"blob", blob("video/mp4"), true},
			{"timeline", rpc("app.bsky.feed.getTimeline", appview), true},
			{"chat", rpc("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), false},
			{"move away", rpc("com.atproto.server.createAccount", "did:web:other.example"), false},
			{"email", account("email", "read"), false},
			{"import", account("repo", "manage"), false},
			{"handle", ident("handle"), false},
		},
		"atproto transition:generic transition:chat.bsky transition:email": {
			{"chat", rpc("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), true},
			{"email", account("email", "read"), true},
			{"change email", account("email", "manage"), false},
		},
		"atproto transition:generic rpc:com.atproto.server.createAccount?aud=*": {
			{"move away, granted", rpc("com.atproto.server.createAccount", "did:web:other.example"), true},
		},
		"atproto transition:chat.bsky": {
			{"chat without generic", rpc("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), false},
		},
		"atproto repo:app.bsky.feed.post?action=create repo?collection=app.bsky.feed.like&collection=app.bsky.graph.follow": {
			{"create post", repo("app.bsky.feed.post", "create"), true},
			{"delete post", repo("app.bsky.feed.post", "delete"), false},
			{"delete like", repo("app.bsky.feed.like", "delete"), true},
			{"update follow", repo("app.bsky.graph.follow", "update"), true},
			{"profile", repo("app.bsky.actor.profile", "update"), false},
		},
		"atproto repo:*?action=delete": {
			{"delete anything", repo("com.example.thing", "delete"), true},
			{"create anything", repo("com.example.thing", "create"), false},
		},
		"atproto blob:image/* blob?accept=video/mp4&accept=text/html": {
			{"png", blob("image/png"), true},
			{"png with params", blob("IMAGE/PNG; q=1"), true},
			{"mp4", blob("video/mp4"), true},
			{"webm", blob("video/webm"), false},
			{"pdf", blob("application/pdf"), false},
		},
		"atproto rpc:app.bsky.feed.getTimeline?aud=did:web:api.bsky.app%23bsky_appview rpc:com.atproto.moderation.createReport?aud=*": {
			{"timeline at appview", rpc("app.bsky.feed.getTimeline", appview), true},
			{"timeline elsewhere", rpc("app.bsky.feed.getTimeline", "did:web:evil.example#bsky_appview"), false},
			{"report anywhere", rpc("com.atproto.moderation.createReport", "did:plc:mod#atproto_labeler"), true},
			{"other method", rpc("app.bsky.feed.getFeed", appview), false},
		},
		"atproto rpc?lxm=*&aud=did:web:api.bsky.app%23bsky_appview": {
			{"any method at appview", rpc("app.bsky.actor.getProfile", appview), true},
			{"not elsewhere", rpc("app.bsky.actor.getProfile", "did:web:other.example#x"), false},
		},
		"atproto account:email account:repo?action=manage identity:handle": {
			{"read email", account("email", "read"), true},
			{"manage email", account("email", "manage"), false},
			{"import repo", account("repo", "manage"), true},
			{"handle", ident("handle"), true},
			{"whole identity", ident("*"), false},
		},
		"atproto identity:* bogus:thing repo:not-an-nsid include:com.example.set": {
			{"whole identity", ident("*"), true},
			{"handle", ident("handle"), true},
			{"unparsed ignored", repo("not-an-nsid", "create"), false},
		},
	}
	for scope, checks := range tests {
		p := oauth.ParsePermissions(scope)
		require.Equal(t, scope, p.Scope())
		for _, c := range checks {
			require.Equal(t, c.want, c.ok(p), "%s: %s", scope, c.what)
		}
	}
	var zero oauth.Permissions
	require.False(t, zero.CanRepo("app.bsky.feed.post", "create"))
}

func TestDescribeScope(t *testing.T) {
	t.Parallel()
	lines := oauth.DescribeScope("atproto repo:app.bsky.feed.post?action=create blob:image/* rpc:app.bsky.feed.getTimeline?aud=did:web:api.bsky.app%23bsky_appview account:email?action=manage identity:handle")
	joined := strings.Join(lines, "\n")
	for _, want := range []string{
		"Know which account you are",
		"Create records of kind app.bsky.feed.post",
		"Upload files of type image/*",
		"Call the method app.bsky.feed.getTimeline on the service did:web:api.bsky.app#bsky_appview",
		"See and change your email address",
		"Change your handle.",
	} {
		require.Contains(t, joined, want)
	}
	require.Len(t, oauth.DescribeScope("atproto"), 1)
}
