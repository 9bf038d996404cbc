package oauth_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

const appview = "did:web:api.bsky.app#bsky_appview"

// permCheck is one question put to a scope's Permissions.
type permCheck struct {
	what string
	ok   func(*oauth.Permissions) bool
	want bool
}

func canRepo(collection, action string) func(*oauth.Permissions) bool {
	return func(p *oauth.Permissions) bool { return p.CanRepo(collection, action) }
}

func canBlob(mime string) func(*oauth.Permissions) bool {
	return func(p *oauth.Permissions) bool { return p.CanBlob(mime) }
}

func canRPC(lxm, aud string) func(*oauth.Permissions) bool {
	return func(p *oauth.Permissions) bool { return p.CanRPC(lxm, aud) }
}

func canAccount(attr, action string) func(*oauth.Permissions) bool {
	return func(p *oauth.Permissions) bool { return p.CanAccount(attr, action) }
}

func canIdentity(attr string) func(*oauth.Permissions) bool {
	return func(p *oauth.Permissions) bool { return p.CanIdentity(attr) }
}

func TestPermissions(t *testing.T) {
	t.Parallel()
	tests := map[string][]permCheck{
		"atproto": {
			{"post", canRepo("app.bsky.feed.post", "create"), false},
			{"blob", canBlob("image/png"), false},
			{"timeline", canRPC("app.bsky.feed.getTimeline", appview), false},
			{"email", canAccount("email", "read"), false},
			{"handle", canIdentity("handle"), false},
		},
		"atproto transition:generic": {
			{"post", canRepo("app.bsky.feed.post", "delete"), true},
			{"blob", canBlob("video/mp4"), true},
			{"timeline", canRPC("app.bsky.feed.getTimeline", appview), true},
			{"chat", canRPC("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), false},
			{"move away", canRPC("com.atproto.server.createAccount", "did:web:other.example"), false},
			{"token for any method", canRPC("", appview), false},
			{"email", canAccount("email", "read"), false},
			{"import", canAccount("repo", "manage"), false},
			{"handle", canIdentity("handle"), false},
		},
		"atproto transition:generic transition:chat.bsky transition:email": {
			{"chat", canRPC("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), true},
			{"email", canAccount("email", "read"), true},
			{"change email", canAccount("email", "manage"), false},
		},
		"atproto transition:generic rpc:com.atproto.server.createAccount?aud=*": {
			{"move away, granted", canRPC("com.atproto.server.createAccount", "did:web:other.example"), true},
		},
		"atproto transition:chat.bsky": {
			{"chat without generic", canRPC("chat.bsky.convo.listConvos", "did:web:api.bsky.chat#bsky_chat"), false},
		},
		"atproto repo:app.bsky.feed.post?action=create repo?collection=app.bsky.feed.like&collection=app.bsky.graph.follow": {
			{"create post", canRepo("app.bsky.feed.post", "create"), true},
			{"delete post", canRepo("app.bsky.feed.post", "delete"), false},
			{"delete like", canRepo("app.bsky.feed.like", "delete"), true},
			{"update follow", canRepo("app.bsky.graph.follow", "update"), true},
			{"profile", canRepo("app.bsky.actor.profile", "update"), false},
		},
		"atproto repo:*?action=delete": {
			{"delete anything", canRepo("com.example.thing", "delete"), true},
			{"create anything", canRepo("com.example.thing", "create"), false},
		},
		"atproto blob:image/* blob?accept=video/mp4&accept=text/html": {
			{"png", canBlob("image/png"), true},
			{"png with params", canBlob("IMAGE/PNG; q=1"), true},
			{"mp4", canBlob("video/mp4"), true},
			{"webm", canBlob("video/webm"), false},
			{"pdf", canBlob("application/pdf"), false},
		},
		"atproto rpc:app.bsky.feed.getTimeline?aud=did:web:api.bsky.app%23bsky_appview rpc:com.atproto.moderation.createReport?aud=*": {
			{"timeline at appview", canRPC("app.bsky.feed.getTimeline", appview), true},
			{"timeline elsewhere", canRPC("app.bsky.feed.getTimeline", "did:web:evil.example#bsky_appview"), false},
			{"report anywhere", canRPC("com.atproto.moderation.createReport", "did:plc:mod#atproto_labeler"), true},
			{"other method", canRPC("app.bsky.feed.getFeed", appview), false},
			{"token for any method", canRPC("", appview), false},
		},
		"atproto rpc?lxm=*&aud=did:web:api.bsky.app%23bsky_appview": {
			{"any method at appview", canRPC("app.bsky.actor.getProfile", appview), true},
			{"not elsewhere", canRPC("app.bsky.actor.getProfile", "did:web:other.example#x"), false},
			{"token for any method at appview", canRPC("", appview), true},
			{"token for any method elsewhere", canRPC("", "did:web:other.example#x"), false},
		},
		"atproto account:email account:repo?action=manage identity:handle": {
			{"read email", canAccount("email", "read"), true},
			{"manage email", canAccount("email", "manage"), false},
			{"import repo", canAccount("repo", "manage"), true},
			{"handle", canIdentity("handle"), true},
			{"whole identity", canIdentity("*"), false},
		},
		"atproto identity:* bogus:thing repo:not-an-nsid include:com.example.set": {
			{"whole identity", canIdentity("*"), true},
			{"handle", canIdentity("handle"), true},
			{"unparsed ignored", canRepo("not-an-nsid", "create"), false},
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
