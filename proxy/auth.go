package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// KeySource gives the private key an account signs with (its repository
// signing key, the #atproto key of its DID document).
type KeySource interface {
	SigningKey(ctx context.Context, did syntax.DID) (atcrypto.PrivateKey, error)
}

// ServiceTokenTTL is the lifetime of the service tokens the proxy mints.
const ServiceTokenTTL = 60 * time.Second

// Methods with special token rules.
const (
	getFeedNSID         syntax.NSID = "app.bsky.feed.getFeed"
	getFeedSkeletonNSID syntax.NSID = "app.bsky.feed.getFeedSkeleton"
	getFeedGeneratorURL             = "/xrpc/app.bsky.feed.getFeedGenerator?feed="
	feedGeneratorNSID   syntax.NSID = "app.bsky.feed.generator"
	// maxFeedGeneratorResponse bounds a getFeedGenerator answer; a
	// generator view is a few kilobytes.
	maxFeedGeneratorResponse = 256 << 10
)

// authorization returns the Authorization header for the upstream request
// ("" for none): a fresh service token when the caller is authenticated.
// Its audience is the target's DID without fragment and its lxm the method,
// except for getFeed, whose token is for the feed generator's
// getFeedSkeleton.
func (p *Proxy) authorization(ctx context.Context, r *http.Request, nsid syntax.NSID, t Target, c Caller) (string, error) {
	if !c.Authenticated || c.DID == "" || p.cfg.Keys == nil {
		return "", nil
	}
	aud, lxm := t.DID, nsid
	if nsid == getFeedNSID {
		gen, err := p.feedGenerator(ctx, t, r.URL.Query().Get("feed"))
		if err != nil {
			return "", err
		}
		aud, lxm = gen, getFeedSkeletonNSID
	}
	tok, err := p.mint(ctx, c.DID, aud, lxm)
	if err != nil {
		return "", err
	}
	return "Bearer " + tok, nil
}

// mint signs a service token iss → aud for lxm, never for a protected
// method.
func (p *Proxy) mint(ctx context.Context, iss, aud syntax.DID, lxm syntax.NSID) (string, error) {
	if IsProtected(lxm) {
		return "", newError(ErrProtectedMethod, nil, "%s cannot be proxied", lxm)
	}
	key, err := p.cfg.Keys.SigningKey(ctx, iss)
	if err != nil {
		return "", newError(ErrSigning, err, "cannot sign a service token for %s", iss)
	}
	tok, err := auth.SignServiceAuth(iss, string(aud), ServiceTokenTTL, &lxm, key)
	if err != nil {
		return "", newError(ErrSigning, err, "cannot sign a service token for %s", iss)
	}
	return tok, nil
}

// feedCache remembers feed generators' DIDs briefly: getFeed is called on
// every scroll, and a generator's DID rarely changes.
type feedCache struct {
	ttl   time.Duration
	cache *lru.Cache[string, feedEntry]
	group singleflight.Group
	now   func() time.Time
}

type feedEntry struct {
	did     syntax.DID
	expires time.Time
}

func newFeedCache(size int, ttl time.Duration) *feedCache {
	c, err := lru.New[string, feedEntry](size)
	if err != nil {
		panic(err) // size is positive after setDefaults
	}
	return &feedCache{ttl: ttl, cache: c, now: time.Now}
}

// feedGenerator returns the DID of the generator of feed (an at:// URI of
// an app.bsky.feed.generator record), asking the target's
// app.bsky.feed.getFeedGenerator.
func (p *Proxy) feedGenerator(ctx context.Context, t Target, feed string) (syntax.DID, error) {
	uri, err := syntax.ParseATURI(feed)
	if err != nil || uri.Collection() != feedGeneratorNSID || uri.RecordKey() == "" {
		return "", newError(ErrBadRequest, err, "feed must be the at:// URI of a feed generator record")
	}
	key := t.URL + " " + uri.String()
	fc := p.feeds
	if e, ok := fc.cache.Get(key); ok && fc.now().Before(e.expires) {
		return e.did, nil
	}
	v, err, _ := fc.group.Do(key, func() (any, error) {
		did, err := p.fetchFeedGenerator(ctx, t, uri)
		if err != nil {
			return nil, err
		}
		fc.cache.Add(key, feedEntry{did: did, expires: fc.now().Add(fc.ttl)})
		return did, nil
	})
	if err != nil {
		return "", err
	}
	return v.(syntax.DID), nil
}

func (p *Proxy) fetchFeedGenerator(ctx context.Context, t Target, uri syntax.ATURI) (syntax.DID, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HeaderTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL+getFeedGeneratorURL+url.QueryEscape(uri.String()), nil)
	if err != nil {
		return "", newError(ErrUpstreamFailure, err, "cannot look up feed generator %s", uri)
	}
	req.Header.Set("User-Agent", p.cfg.UserAgent)
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", newError(ErrUpstreamTimeout, err, "looking up feed generator %s timed out", uri)
		}
		return "", newError(ErrUpstreamFailure, err, "cannot look up feed generator %s", uri)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusNotFound:
		return "", newError(ErrUnknownFeed, nil, "could not resolve feed generator %s", uri)
	default:
		return "", newError(ErrUpstreamFailure, nil, "looking up feed generator %s: app view answered %d", uri, resp.StatusCode)
	}
	var out struct {
		View struct {
			DID string `json:"did"`
		} `json:"view"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxFeedGeneratorResponse)).Decode(&out); err != nil {
		return "", newError(ErrUpstreamFailure, err, "looking up feed generator %s: unreadable answer", uri)
	}
	did, err := syntax.ParseDID(out.View.DID)
	if err != nil {
		return "", newError(ErrUnknownFeed, err, "feed generator %s has no valid DID", uri)
	}
	return did, nil
}
