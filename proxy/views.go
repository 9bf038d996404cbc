package proxy

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// View shapes follow the reference PDS's read-after-write LocalViewer:
// a post authored by the caller, counts at zero, the author built from the
// local profile, its embed rendered as the app view renders it (embeds.go).

const (
	threadViewPostType = "app.bsky.feed.defs#threadViewPost"
	invalidHandle      = "handle.invalid"
)

// viewer renders the caller's local records as app view objects. It is
// used by one goroutine.
type viewer struct {
	did            syntax.DID
	handle         string
	profile        map[string]any // the current profile record; nil: none
	profileChanged bool
	posts          []localPost // oldest first
	image          func(kind string, did syntax.DID, cid string) string
	// video builds a video view's playlist and thumbnail URLs ("" when
	// no pattern is configured).
	video func(thumbnail bool, did syntax.DID, cid string) string
	// call asks the configured app view for the caller (nil: no app view).
	call appViewCall
	// records are the app view's views of the records the posts embed,
	// by URI, fetched at the first embed that needs one.
	records map[string]map[string]any
}

type localPost struct {
	rec   Record
	uri   string
	value map[string]any
}

// newViewer returns a viewer for c's local records, whose app view
// lookups end when done is called.
func (p *Proxy) newViewer(ctx context.Context, c Caller, local *LocalRecords) (v *viewer, done func()) {
	v = &viewer{did: c.DID, handle: local.Handle, image: p.imageURL, video: p.videoURL}
	// A parent thread (getPostThread) may be as large as any answer.
	v.call, done = p.appViewCaller(ctx, c, p.cfg.MaxResponseBytes)
	if v.handle == "" {
		v.handle = invalidHandle
	}
	if local.Profile != nil {
		if m, err := decodeObject(local.Profile.Value); err == nil {
			v.profile = m
			v.profileChanged = local.ProfileChanged
		}
	}
	posts := local.Posts
	if len(posts) > MaxLocalPosts {
		posts = posts[len(posts)-MaxLocalPosts:]
	}
	for _, rec := range posts {
		if m, err := decodeObject(rec.Value); err == nil {
			v.posts = append(v.posts, localPost{rec: rec, uri: rec.URI.String(), value: m})
		}
	}
	return v, done
}

// imageURL is where a client fetches the caller's blob cid as kind
// (avatar, banner, feed_thumbnail, feed_fullsize); "" when unknown. As the
// reference PDS forms it: the app view's CDN when a pattern is set, else
// this server's getBlob with the DID as it is (a did:plc needs no
// escaping in a query).
func (p *Proxy) imageURL(kind string, did syntax.DID, cid string) string {
	if p.cfg.CDNURLPattern != "" {
		return fmt.Sprintf(p.cfg.CDNURLPattern, kind, did, cid)
	}
	if p.cfg.PublicURL != "" {
		d := string(did)
		if strings.ContainsAny(d, "%&#+ ") {
			d = url.QueryEscape(d)
		}
		return p.cfg.PublicURL + "/xrpc/com.atproto.sync.getBlob?did=" + d + "&cid=" + cid
	}
	return ""
}

// videoURL is a video view's playlist (or thumbnail) URL for the caller's
// video blob cid, as the app view forms them; "" without a pattern.
func (p *Proxy) videoURL(thumbnail bool, did syntax.DID, cid string) string {
	pattern := p.cfg.VideoPlaylistPattern
	if thumbnail {
		pattern = p.cfg.VideoThumbnailPattern
	}
	if pattern == "" {
		return ""
	}
	return fmt.Sprintf(pattern, url.QueryEscape(string(did)), url.QueryEscape(cid))
}

// blobURL is the image URL of a blob reference (current or legacy form).
func (v *viewer) blobURL(kind string, blob any) string {
	link := blobLink(blob)
	if link == "" {
		return ""
	}
	return v.image(kind, v.did, link)
}

func (v *viewer) isSelf(actor string) bool {
	return actor == string(v.did) || (v.handle != invalidHandle && strings.EqualFold(actor, v.handle))
}

// profileBasic is app.bsky.actor.defs#profileViewBasic of the caller.
func (v *viewer) profileBasic() map[string]any {
	out := map[string]any{"did": string(v.did), "handle": v.handle}
	if dn, ok := v.profile["displayName"].(string); ok {
		out["displayName"] = dn
	}
	if u := v.blobURL("avatar", v.profile["avatar"]); u != "" {
		out["avatar"] = u
	}
	return out
}

// updateBasic, updateView and updateDetailed refresh an app view profile
// view of the caller from the local profile record.
func (v *viewer) updateBasic(view map[string]any) {
	setString(view, "displayName", v.profile["displayName"])
	v.setImage(view, "avatar", "avatar")
}

func (v *viewer) updateDetailed(view map[string]any) {
	v.updateBasic(view)
	setString(view, "description", v.profile["description"])
	v.setImage(view, "banner", "banner")
}

func setString(view map[string]any, key string, val any) {
	if s, ok := val.(string); ok {
		view[key] = s
	} else {
		delete(view, key)
	}
}

func (v *viewer) setImage(view map[string]any, key, kind string) {
	blob := v.profile[key]
	if blob == nil {
		delete(view, key)
		return
	}
	if u := v.blobURL(kind, blob); u != "" {
		view[key] = u
	}
}

// postView is app.bsky.feed.defs#postView of a local post.
func (v *viewer) postView(lp localPost) map[string]any {
	view := map[string]any{
		"uri":         lp.uri,
		"cid":         lp.rec.CID.String(),
		"author":      v.profileBasic(),
		"record":      lp.value,
		"replyCount":  0,
		"repostCount": 0,
		"likeCount":   0,
		"quoteCount":  0,
		"indexedAt":   lp.rec.IndexedAt.UTC().Format("2006-01-02T15:04:05.000Z"),
	}
	if e := v.embedView(lp.value["embed"]); e != nil {
		view["embed"] = e
	}
	return view
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func itemPost(item any) map[string]any { return asMap(asMap(item)["post"]) }

func indexedAt(post map[string]any) time.Time {
	s, _ := post["indexedAt"].(string)
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// replyRefs returns a post record's reply root and parent URIs ("" when
// it is not a reply).
func replyRefs(record map[string]any) (root, parent string) {
	reply := asMap(record["reply"])
	root, _ = asMap(reply["root"])["uri"].(string)
	parent, _ = asMap(reply["parent"])["uri"].(string)
	return root, parent
}

// insertPosts puts posts newer than the feed's last item into the feed,
// each before the first item older than it, as the reference PDS does.
func (v *viewer) insertPosts(feed []any, posts []localPost) ([]any, bool) {
	var last time.Time
	seen := make(map[string]bool, len(feed))
	for _, it := range feed {
		post := itemPost(it)
		last = indexedAt(post)
		if uri, ok := post["uri"].(string); ok {
			seen[uri] = true
		}
	}
	changed := false
	for i := len(posts) - 1; i >= 0; i-- { // newest first
		lp := posts[i]
		if !lp.rec.IndexedAt.After(last) || seen[lp.uri] {
			continue
		}
		idx := len(feed)
		for j, it := range feed {
			if indexedAt(itemPost(it)).Before(lp.rec.IndexedAt) {
				idx = j
				break
			}
		}
		feed = slices.Insert(feed, idx, any(map[string]any{"post": v.postView(lp)}))
		changed = true
	}
	return feed, changed
}

// filterPosts applies getAuthorFeed's filter parameter to local posts.
// Posts with video are kept for posts_with_video only when video views
// can be rendered.
func filterPosts(posts []localPost, filter string, did syntax.DID, video bool) []localPost {
	keep := func(lp localPost) bool {
		root, _ := replyRefs(lp.value)
		switch filter {
		case "posts_no_replies":
			return root == ""
		case "posts_with_media":
			embed := asMap(lp.value["embed"])
			return embed["$type"] == imagesEmbed || asMap(embed["media"])["$type"] == imagesEmbed
		case "posts_with_video":
			embed := asMap(lp.value["embed"])
			return video && (embed["$type"] == videoEmbed || asMap(embed["media"])["$type"] == videoEmbed)
		case "posts_and_author_threads":
			return root == "" || strings.HasPrefix(root, "at://"+string(did)+"/")
		default:
			return true
		}
	}
	var out []localPost
	for _, lp := range posts {
		if keep(lp) {
			out = append(out, lp)
		}
	}
	return out
}
