package fakeservices

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// handler answers one XRPC method.
type handler struct {
	// aud, when set, is the audience the method's token must carry instead
	// of the service's DID; lxm, when set, the lexicon method instead of
	// the one called (getFeed's tokens are the feed generator's).
	aud func() string
	lxm syntax.NSID
	// required makes the method answer 401 without a valid token.
	required bool
	// serve answers; caller is the verified issuer, "" without a token.
	serve func(w http.ResponseWriter, r *http.Request, caller syntax.DID)
}

func (s *Services) mux(svc Service, hs map[string]handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_recorded" {
			writeJSON(w, s.Calls())
			return
		}
		if r.URL.Path == "/_repoRev" && r.Method == http.MethodPost {
			// SetRepoRev for scripts: POST /_repoRev?did=...&rev=...
			s.SetRepoRev(syntax.DID(r.URL.Query().Get("did")), r.URL.Query().Get("rev"))
			w.WriteHeader(http.StatusNoContent)
			return
		}
		method := strings.TrimPrefix(r.URL.Path, "/xrpc/")
		h, ok := hs[method]
		if !ok {
			s.verify(r, svc, method, string(svc.DID), syntax.NSID(method))
			writeError(w, http.StatusNotImplemented, "MethodNotImplemented", "the fake "+svc.Name+" does not serve "+method)
			return
		}
		aud, lxm := string(svc.DID), syntax.NSID(method)
		if h.aud != nil {
			aud = h.aud()
		}
		if h.lxm != "" {
			lxm = h.lxm
		}
		caller := s.verify(r, svc, method, aud, lxm)
		if caller == "" && h.required {
			writeError(w, http.StatusUnauthorized, "AuthenticationRequired", "a valid service-auth token is required")
			return
		}
		h.serve(w, r, caller)
	})
}

// fakeAuthor writes the posts the app view shows that are not the
// caller's.
const fakeAuthor = "did:plc:fakeauthor2345fakeauthor"

// upstreamTime is when everything the fakes show was indexed: long ago, so
// that whatever a test writes now is newer.
var upstreamTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// ResolvableHandle is the one handle the fake app view resolves (to
// fakeAuthor): one a PDS cannot resolve itself.
const ResolvableHandle = "friend.elsewhere.invalid"

func (s *Services) appViewHandlers() map[string]handler {
	return map[string]handler{
		"com.atproto.identity.resolveHandle": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			if r.URL.Query().Get("handle") != ResolvableHandle {
				writeError(w, http.StatusBadRequest, "HandleNotFound", "Unable to resolve handle")
				return
			}
			s.answer(w, caller, map[string]any{"did": fakeAuthor})
		}},
		"app.bsky.feed.getTimeline": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			s.answer(w, caller, map[string]any{"feed": []any{
				feedItem(postView(fakeAuthor, "timeline1", "upstream timeline post", upstreamTime.Add(time.Hour))),
				feedItem(postView(fakeAuthor, "timeline2", "an older timeline post", upstreamTime)),
			}, "cursor": "fake-cursor"})
		}},
		"app.bsky.feed.getAuthorFeed": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			actor := actorDID(r.URL.Query().Get("actor"))
			if actor == string(caller) && caller != "" {
				// It has indexed none of the caller's own posts: a new
				// account's feed, as an app view that lags sees it.
				s.answer(w, caller, map[string]any{"feed": []any{}})
				return
			}
			s.answer(w, caller, map[string]any{"feed": []any{feedItem(postView(actor, "authored1", "an upstream post by the actor", upstreamTime))}})
		}},
		// getPostThread and getPosts know the fake author's posts only:
		// anyone else's, the caller's new posts included, are not found.
		"app.bsky.feed.getPostThread": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			uri, err := syntax.ParseATURI(r.URL.Query().Get("uri"))
			if err != nil || uri.Authority().String() != fakeAuthor {
				s.answerError(w, caller, http.StatusBadRequest, "NotFound", "Post not found: "+r.URL.Query().Get("uri"))
				return
			}
			s.answer(w, caller, map[string]any{"thread": map[string]any{
				"$type": "app.bsky.feed.defs#threadViewPost",
				"post":  postView(fakeAuthor, uri.RecordKey().String(), "an upstream post", upstreamTime),
			}})
		}},
		"app.bsky.feed.getPosts": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			posts := []any{}
			for _, raw := range r.URL.Query()["uris"] {
				if uri, err := syntax.ParseATURI(raw); err == nil && uri.Authority().String() == fakeAuthor {
					posts = append(posts, postView(fakeAuthor, uri.RecordKey().String(), "an upstream post", upstreamTime))
				}
			}
			s.answer(w, caller, map[string]any{"posts": posts})
		}},
		"app.bsky.actor.getProfile": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			s.answer(w, caller, profileDetailed(actorDID(r.URL.Query().Get("actor"))))
		}},
		"app.bsky.feed.getFeedGenerator": {serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			s.answer(w, caller, map[string]any{"view": map[string]any{
				"uri": r.URL.Query().Get("feed"), "cid": fakeCID("generator"), "did": s.FeedGen.DID.String(),
				"creator": profileBasic(s.FeedGen.DID.String()), "displayName": "Fake feed", "indexedAt": stamp(upstreamTime),
			}, "isOnline": true, "isValid": true})
		}},
		"app.bsky.feed.getFeed": {
			aud:      func() string { return s.FeedGen.DID.String() },
			lxm:      "app.bsky.feed.getFeedSkeleton",
			required: true,
			serve:    s.getFeed,
		},
		"app.bsky.notification.listNotifications": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			like := map[string]any{"$type": "app.bsky.feed.like", "createdAt": stamp(upstreamTime),
				"subject": map[string]any{"uri": "at://" + caller.String() + "/app.bsky.feed.post/liked", "cid": fakeCID("liked")}}
			s.answer(w, caller, map[string]any{"notifications": []any{map[string]any{
				"uri": "at://" + fakeAuthor + "/app.bsky.feed.like/like1", "cid": fakeCID("like1"), "author": profileBasic(fakeAuthor),
				"reason": "like", "record": like, "isRead": false, "indexedAt": stamp(upstreamTime),
			}}})
		}},
		"app.bsky.actor.getPreferences": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			s.mu.Lock()
			prefs := s.prefs[caller]
			s.mu.Unlock()
			if prefs == nil {
				prefs = json.RawMessage("[]")
			}
			s.answer(w, caller, map[string]any{"preferences": prefs})
		}},
		"app.bsky.actor.putPreferences": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			var in struct {
				Preferences json.RawMessage `json:"preferences"`
			}
			if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil || in.Preferences == nil {
				writeError(w, http.StatusBadRequest, "InvalidRequest", "want {\"preferences\": [...]}")
				return
			}
			s.mu.Lock()
			s.prefs[caller] = in.Preferences
			s.mu.Unlock()
			w.WriteHeader(http.StatusOK)
		}},
	}
}

// getFeed asks the feed generator for the skeleton with the caller's token,
// as Bluesky's app view does, and hydrates it.
func (s *Services) getFeed(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
	u := s.FeedGen.URL + "/xrpc/app.bsky.feed.getFeedSkeleton?feed=" + url.QueryEscape(r.URL.Query().Get("feed"))
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u, nil)
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		writeError(w, http.StatusBadGateway, "UpstreamFailure", err.Error())
		return
	}
	defer resp.Body.Close()
	var skel struct {
		Feed []struct {
			Post string `json:"post"`
		} `json:"feed"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&skel) != nil {
		writeError(w, http.StatusBadGateway, "UpstreamFailure", fmt.Sprintf("feed generator answered %d", resp.StatusCode))
		return
	}
	feed := []any{}
	for _, it := range skel.Feed {
		at, err := syntax.ParseATURI(it.Post)
		if err != nil {
			continue
		}
		feed = append(feed, feedItem(postView(at.Authority().String(), at.RecordKey().String(), "a post from the fake feed", upstreamTime)))
	}
	s.answer(w, caller, map[string]any{"feed": feed})
}

func (s *Services) chatHandlers() map[string]handler {
	return map[string]handler{
		"chat.bsky.convo.listConvos": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			writeJSON(w, map[string]any{"convos": []any{}})
		}},
	}
}

func (s *Services) feedGenHandlers() map[string]handler {
	return map[string]handler{
		"app.bsky.feed.getFeedSkeleton": {required: true, serve: func(w http.ResponseWriter, r *http.Request, caller syntax.DID) {
			writeJSON(w, map[string]any{"feed": []any{map[string]any{"post": "at://" + fakeAuthor + "/app.bsky.feed.post/fromfeed"}}})
		}},
	}
}

// answer writes an app view answer, stamped with the repository revision
// the app view claims for the caller.
func (s *Services) answer(w http.ResponseWriter, caller syntax.DID, v any) {
	if caller != "" {
		if rev := s.repoRev(caller); rev != "" {
			w.Header().Set("Atproto-Repo-Rev", rev)
		}
	}
	writeJSON(w, v)
}

// answerError writes an XRPC error answer, stamped like answer: an app
// view's NotFound carries the revision it has seen.
func (s *Services) answerError(w http.ResponseWriter, caller syntax.DID, status int, name, msg string) {
	if caller != "" {
		if rev := s.repoRev(caller); rev != "" {
			w.Header().Set("Atproto-Repo-Rev", rev)
		}
	}
	writeError(w, status, name, msg)
}

// FakeAuthor is the DID of the account whose posts the fake app view
// shows (and finds with getPostThread and getPosts).
const FakeAuthor = fakeAuthor

// actorDID is the DID an actor parameter names; a handle stands for the
// fake author.
func actorDID(actor string) string {
	if _, err := syntax.ParseDID(actor); err == nil {
		return actor
	}
	return fakeAuthor
}

func profileBasic(did string) map[string]any {
	return map[string]any{"did": did, "handle": "upstream.test", "displayName": "Upstream name"}
}

func profileDetailed(did string) map[string]any {
	p := profileBasic(did)
	p["description"] = "as the app view has it"
	p["followersCount"], p["followsCount"], p["postsCount"] = 1, 2, 3
	p["indexedAt"] = stamp(upstreamTime)
	return p
}

func postView(author, rkey, text string, at time.Time) map[string]any {
	return map[string]any{
		"uri":        "at://" + author + "/app.bsky.feed.post/" + rkey,
		"cid":        fakeCID(author + rkey),
		"author":     profileBasic(author),
		"record":     map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": stamp(at)},
		"replyCount": 0, "repostCount": 0, "likeCount": 0, "quoteCount": 0,
		"indexedAt": stamp(at),
	}
}

func feedItem(post map[string]any) map[string]any { return map[string]any{"post": post} }

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// fakeCID is a well-formed CID (dag-cbor, sha-256) derived from seed.
func fakeCID(seed string) string {
	c, err := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256).Sum([]byte(seed))
	if err != nil {
		panic(err) // sha-256 of any input succeeds
	}
	return c.String()
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, name, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": name, "message": msg})
}
