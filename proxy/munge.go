package proxy

import (
	"net/url"
)

// The mungers below follow the reference PDS's read-after-write handlers
// (api/app/bsky/{feed,actor}/*.ts), with two changes: a request for a
// later page (cursor) gets no new posts, which belong on the first page;
// and getAuthorFeed knows whose feed it is from its actor parameter and
// applies its filter to the local posts.

// mungeTimeline puts the caller's new posts into their timeline.
func mungeTimeline(v *viewer, body map[string]any, q url.Values) bool {
	feed, ok := body["feed"].([]any)
	if !ok || q.Get("cursor") != "" {
		return false
	}
	out, changed := v.insertPosts(feed, v.posts)
	body["feed"] = out
	return changed
}

// mungeAuthorFeed refreshes the caller's author views in their own feed
// and puts their new posts in.
func mungeAuthorFeed(v *viewer, body map[string]any, q url.Values) bool {
	feed, ok := body["feed"].([]any)
	if !ok || !v.isSelf(q.Get("actor")) {
		return false
	}
	changed := v.refreshAuthors(feed)
	if q.Get("cursor") == "" {
		out, inserted := v.insertPosts(feed, filterPosts(v.posts, q.Get("filter"), v.did, v.video(false, v.did, "x") != ""))
		feed, changed = out, changed || inserted
	}
	body["feed"] = feed
	return changed
}

// mungeActorLikes refreshes the caller's author views in a likes feed.
func mungeActorLikes(v *viewer, body map[string]any, _ url.Values) bool {
	feed, ok := body["feed"].([]any)
	return ok && v.refreshAuthors(feed)
}

// refreshAuthors updates the feed's posts authored by the caller from the
// changed local profile.
func (v *viewer) refreshAuthors(feed []any) bool {
	if !v.profileChanged {
		return false
	}
	changed := false
	for _, it := range feed {
		author := asMap(itemPost(it)["author"])
		if author != nil && author["did"] == string(v.did) {
			v.updateBasic(author)
			changed = true
		}
	}
	return changed
}

// mungeProfile refreshes the caller's own profile view.
func mungeProfile(v *viewer, body map[string]any, _ url.Values) bool {
	if !v.profileChanged || body["did"] != string(v.did) {
		return false
	}
	v.updateDetailed(body)
	return true
}

// mungeProfiles refreshes the caller's profile among others.
func mungeProfiles(v *viewer, body map[string]any, _ url.Values) bool {
	profiles, _ := body["profiles"].([]any)
	if !v.profileChanged {
		return false
	}
	changed := false
	for _, it := range profiles {
		if m := asMap(it); m != nil && m["did"] == string(v.did) {
			v.updateDetailed(m)
			changed = true
		}
	}
	return changed
}
