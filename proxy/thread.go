package proxy

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// getPostThreadNSID is the read whose NotFound answers get read-after-write
// too: the caller's own post, just written, is not in the app view yet.
const getPostThreadNSID syntax.NSID = "app.bsky.feed.getPostThread"

// mungePostThread adds the caller's new replies to a thread.
func mungePostThread(v *viewer, body map[string]any, _ url.Values) bool {
	thread := asMap(body["thread"])
	if thread == nil || thread["$type"] != threadViewPostType {
		return false
	}
	return v.addToThread(thread, "")
}

// addToThread puts the caller's new posts that belong to thread (their
// root is its anchor, or the anchor's root) under their parents, each
// first among its siblings, as the reference PDS does. skip is a post
// not to add (the anchor itself).
func (v *viewer) addToThread(thread map[string]any, skip string) bool {
	anchor := asMap(thread["post"])
	anchorURI, _ := anchor["uri"].(string)
	anchorRoot, _ := replyRefs(asMap(anchor["record"]))
	changed := false
	for _, lp := range v.posts {
		root, parent := replyRefs(lp.value)
		if lp.uri == skip || root == "" || (root != anchorURI && root != anchorRoot) {
			continue
		}
		if v.insertReply(thread, lp, parent) {
			changed = true
		}
	}
	return changed
}

// insertReply puts lp first among the replies of the post it answers,
// wherever that is below view.
func (v *viewer) insertReply(view map[string]any, lp localPost, parent string) bool {
	replies, _ := view["replies"].([]any)
	if uri, _ := asMap(view["post"])["uri"].(string); uri == parent {
		for _, r := range replies {
			if u, _ := asMap(asMap(r)["post"])["uri"].(string); u == lp.uri {
				return false
			}
		}
		reply := map[string]any{"$type": threadViewPostType, "post": v.postView(lp)}
		view["replies"] = append([]any{reply}, replies...)
		return true
	}
	for _, r := range replies {
		if m := asMap(r); m != nil && m["$type"] == threadViewPostType && v.insertReply(m, lp, parent) {
			return true
		}
	}
	return false
}

// threadNotFound handles the app view's error answer to the caller's
// getPostThread while it lags behind the repository: when it is NotFound
// and the post asked for is one of the caller's own written since, the
// thread is built here (localThread); any other answer goes out as it
// came.
func (ex *exchange) threadNotFound(w http.ResponseWriter, r *http.Request, resp *http.Response, c Caller, st staleness) error {
	raw, err := ex.readAll(resp.Body)
	if err != nil {
		return err
	}
	if name, _ := errorBody(raw, resp.Header.Get("Content-Encoding")); name == "NotFound" {
		if out, lag := ex.p.localThread(r.Context(), c, r.URL.Query(), st); out != nil {
			ex.writeMunged(w, resp, out, lag)
			return nil
		}
	}
	ex.writeHeader(w, resp)
	_, _ = w.Write(raw) // a failed write means the client left
	return nil
}

// localThread builds getPostThread's answer for the caller's own post at
// q's uri (its DID or handle) from its local records the app view lacks
// (st), as the reference PDS does: the post, the caller's other new
// replies in the thread under it, and its parents as the app view has
// them (asked for with depth 0). Nil when the post is not one of those
// records.
func (p *Proxy) localThread(ctx context.Context, c Caller, q url.Values, st staleness) ([]byte, time.Duration) {
	uri, err := syntax.ParseATURI(q.Get("uri"))
	if err != nil {
		return nil, 0
	}
	local := p.recordsSince(ctx, c.DID, st)
	if local == nil || !isCaller(uri.Authority(), c.DID, local.Handle) {
		return nil, 0
	}
	want := "at://" + string(c.DID) + "/" + uri.Collection().String() + "/" + uri.RecordKey().String()
	v, done := p.newViewer(ctx, c, local)
	defer done()
	var anchor *localPost
	for i := range v.posts {
		if v.posts[i].uri == want {
			anchor = &v.posts[i]
		}
	}
	if anchor == nil {
		return nil, 0
	}
	thread := map[string]any{"$type": threadViewPostType, "post": v.postView(*anchor)}
	v.addToThread(thread, anchor.uri)
	if _, parent := replyRefs(anchor.value); parent != "" && v.call != nil {
		pq := url.Values{"uri": {parent}, "depth": {"0"}}
		if h := q.Get("parentHeight"); h != "" {
			pq.Set("parentHeight", h)
		}
		// Without its parents the thread is still the caller's post: a
		// failed lookup leaves them out, as in the reference PDS.
		if res, err := v.call(getPostThreadNSID, pq); err == nil && res["thread"] != nil {
			thread["parent"] = res["thread"]
		}
	}
	out := p.encode(c.DID, map[string]any{"thread": thread})
	if out == nil {
		return nil, 0
	}
	return out, local.lag(time.Now())
}

// isCaller reports whether an at:// URI's authority names the caller: its
// DID, or its handle.
func isCaller(authority syntax.AtIdentifier, did syntax.DID, handle string) bool {
	if d, err := authority.AsDID(); err == nil {
		return d == did
	}
	h, err := authority.AsHandle()
	return err == nil && handle != "" && strings.EqualFold(h.String(), handle)
}
