package proxy

import (
	"net/url"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Embeds of the caller's spliced posts, rendered as the app view renders
// them (and as the reference PDS's LocalViewer does): images, external
// links and videos from the record alone, with blob URLs formed as
// imageURL and videoURL say; a quoted record (app.bsky.embed.record, and
// the record half of recordWithMedia) as the configured app view shows it,
// asked for once per answer for all the posts together. A quoted record
// the app view does not know, or cannot be asked about, is shown as not
// found: the post still appears.

// Embed record types.
const (
	imagesEmbed          = "app.bsky.embed.images"
	externalEmbed        = "app.bsky.embed.external"
	videoEmbed           = "app.bsky.embed.video"
	recordEmbed          = "app.bsky.embed.record"
	recordWithMediaEmbed = "app.bsky.embed.recordWithMedia"
)

// Collections a quoted record may be in that the app view renders.
const (
	postCollection      = "app.bsky.feed.post"
	generatorCollection = "app.bsky.feed.generator"
	listCollection      = "app.bsky.graph.list"
)

// embedView renders a post's embed; nil when it cannot be rendered (an
// unknown type, a malformed blob, a video without URL patterns).
func (v *viewer) embedView(embed any) map[string]any {
	m := asMap(embed)
	switch m["$type"] {
	case recordEmbed:
		return v.recordEmbedView(m)
	case recordWithMediaEmbed:
		media := v.mediaView(asMap(m["media"]))
		if media == nil {
			return nil
		}
		return map[string]any{
			"$type":  recordWithMediaEmbed + "#view",
			"record": v.recordEmbedView(asMap(m["record"])),
			"media":  media,
		}
	default:
		return v.mediaView(m)
	}
}

// mediaView renders an images, external or video embed.
func (v *viewer) mediaView(m map[string]any) map[string]any {
	switch m["$type"] {
	case imagesEmbed:
		return v.imagesView(m)
	case externalEmbed:
		return v.externalView(m)
	case videoEmbed:
		return v.videoView(m)
	}
	return nil
}

func (v *viewer) imagesView(m map[string]any) map[string]any {
	imgs, _ := m["images"].([]any)
	out := make([]any, 0, len(imgs))
	for _, it := range imgs {
		img := asMap(it)
		thumb, full := v.blobURL("feed_thumbnail", img["image"]), v.blobURL("feed_fullsize", img["image"])
		if thumb == "" || full == "" {
			return nil
		}
		iv := map[string]any{"thumb": thumb, "fullsize": full, "alt": img["alt"]}
		if iv["alt"] == nil {
			iv["alt"] = ""
		}
		if ar, ok := img["aspectRatio"]; ok {
			iv["aspectRatio"] = ar
		}
		out = append(out, iv)
	}
	return map[string]any{"$type": imagesEmbed + "#view", "images": out}
}

func (v *viewer) externalView(m map[string]any) map[string]any {
	ext := asMap(m["external"])
	if ext == nil {
		return nil
	}
	ev := map[string]any{"uri": ext["uri"], "title": ext["title"], "description": ext["description"]}
	if u := v.blobURL("feed_thumbnail", ext["thumb"]); u != "" {
		ev["thumb"] = u
	}
	return map[string]any{"$type": externalEmbed + "#view", "external": ev}
}

// videoView is app.bsky.embed.video#view, as the app view builds it: the
// blob's CID, the playlist and thumbnail of its video service, and the
// record's alt text, aspect ratio and presentation.
func (v *viewer) videoView(m map[string]any) map[string]any {
	cid := blobLink(m["video"])
	if cid == "" {
		return nil
	}
	playlist, thumb := v.video(false, v.did, cid), v.video(true, v.did, cid)
	if playlist == "" {
		return nil
	}
	out := map[string]any{"$type": videoEmbed + "#view", "cid": cid, "playlist": playlist}
	if thumb != "" {
		out["thumbnail"] = thumb
	}
	for _, k := range []string{"alt", "aspectRatio", "presentation"} {
		if val, ok := m[k]; ok {
			out[k] = val
		}
	}
	return out
}

// recordEmbedView is app.bsky.embed.record#view of an embed's strong
// reference.
func (v *viewer) recordEmbedView(m map[string]any) map[string]any {
	uri, _ := asMap(m["record"])["uri"].(string)
	return map[string]any{"$type": recordEmbed + "#view", "record": v.recordView(uri)}
}

// recordView is the app view's view of the record at uri, or
// app.bsky.embed.record#viewNotFound.
func (v *viewer) recordView(uri string) map[string]any {
	if v.records == nil {
		v.records = v.fetchRecords()
	}
	if view, ok := v.records[uri]; ok {
		return view
	}
	return map[string]any{"$type": recordEmbed + "#viewNotFound", "uri": uri, "notFound": true}
}

// maxRecordLookups bounds the records of each kind asked for in one
// answer: a getPosts call takes at most 25 URIs, and MaxLocalPosts posts
// embed at most that many.
const maxRecordLookups = MaxLocalPosts

// fetchRecords asks the app view for every record the posts quote: posts
// in one getPosts, feed generators in one getFeedGenerators, lists one
// getList each. What fails or is missing is left out.
func (v *viewer) fetchRecords() map[string]map[string]any {
	out := map[string]map[string]any{}
	if v.call == nil {
		return out
	}
	byCollection := v.quoted()
	// A failed call leaves a nil answer: its records are not found.
	if uris := byCollection[postCollection]; len(uris) > 0 {
		res, _ := v.call("app.bsky.feed.getPosts", url.Values{"uris": uris})
		for _, it := range asSlice(res["posts"]) {
			if post := asMap(it); post != nil {
				if uri, ok := post["uri"].(string); ok {
					out[uri] = viewRecord(post)
				}
			}
		}
	}
	if uris := byCollection[generatorCollection]; len(uris) > 0 {
		res, _ := v.call("app.bsky.feed.getFeedGenerators", url.Values{"feeds": uris})
		for _, it := range asSlice(res["feeds"]) {
			if gen := asMap(it); gen != nil {
				if uri, ok := gen["uri"].(string); ok {
					out[uri] = typed("app.bsky.feed.defs#generatorView", gen)
				}
			}
		}
	}
	for _, uri := range byCollection[listCollection] {
		res, _ := v.call("app.bsky.graph.getList", url.Values{"list": {uri}, "limit": {"1"}})
		if list := asMap(res["list"]); list != nil {
			out[uri] = typed("app.bsky.graph.defs#listView", list)
		}
	}
	return out
}

// quoted returns the URIs the posts quote, by collection, each once, at
// most maxRecordLookups of each.
func (v *viewer) quoted() map[string][]string {
	out := map[string][]string{}
	seen := map[string]bool{}
	for _, lp := range v.posts {
		embed := asMap(lp.value["embed"])
		ref := asMap(embed["record"])
		if embed["$type"] == recordWithMediaEmbed {
			ref = asMap(ref["record"])
		} else if embed["$type"] != recordEmbed {
			continue
		}
		raw, _ := ref["uri"].(string)
		uri, err := syntax.ParseATURI(raw)
		if err != nil || seen[raw] {
			continue
		}
		seen[raw] = true
		c := uri.Collection().String()
		if len(out[c]) < maxRecordLookups {
			out[c] = append(out[c], raw)
		}
	}
	return out
}

// viewRecord is app.bsky.embed.record#viewRecord of an app view post
// view, as the reference PDS builds it.
func viewRecord(post map[string]any) map[string]any {
	out := map[string]any{"$type": recordEmbed + "#viewRecord"}
	for _, k := range []string{"uri", "cid", "author", "labels", "indexedAt"} {
		if val, ok := post[k]; ok {
			out[k] = val
		}
	}
	out["value"] = post["record"]
	if e, ok := post["embed"]; ok && e != nil {
		out["embeds"] = []any{e}
	}
	return out
}

// typed is view with its $type set.
func typed(t string, view map[string]any) map[string]any {
	out := make(map[string]any, len(view)+1)
	for k, val := range view {
		out[k] = val
	}
	out["$type"] = t
	return out
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// blobLink is the CID of a blob reference (current or legacy form), ""
// when it has none that parses.
func blobLink(blob any) string {
	m := asMap(blob)
	var link string
	if ref, ok := m["ref"].(map[string]any); ok {
		link, _ = ref["$link"].(string)
	} else {
		link, _ = m["cid"].(string)
	}
	if _, err := syntax.ParseCID(link); err != nil {
		return ""
	}
	return link
}
