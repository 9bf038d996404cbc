package oauth

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
)

// LexiconResolver resolves a lexicon's NSID to its published document as
// JSON, verified against its publisher's signed repository
// (lexresolve.Resolver). Its errors go to the log only.
type LexiconResolver interface {
	ResolveLexicon(ctx context.Context, nsid syntax.NSID) (json.RawMessage, error)
}

// The permission set cache: every include: costs a DNS lookup, a DID
// resolution and a fetch from the publisher's PDS, so resolved sets are
// kept (shared by every account and request), failures too for a while,
// concurrent requests for one set share one resolution, at most
// maxSetResolutions run at once, and the cache is bounded in entries and
// bytes. A set is re-resolved once it is an hour old (the permission spec
// asks for at least the access-token lifetime and at most a day); when
// that fails, the set already known is used for up to a day.
const (
	// DefaultLexiconTimeout bounds one set's resolution.
	DefaultLexiconTimeout = 5 * time.Second
	setFreshFor           = time.Hour
	setUsableFor          = 24 * time.Hour
	setFailureTTL         = 30 * time.Second
	maxCachedSets         = 1_000
	maxSetCacheBytes      = 8 << 20
	// maxSetResolutions bounds the sets being resolved at once: a request
	// for another one meanwhile is refused (503), not queued, so slow DNS
	// servers or PDSes cannot pile up requests here.
	maxSetResolutions = 16
)

type setEntry struct {
	set      *permissionSet
	err      error
	resolved time.Time // when set was resolved
	tried    time.Time // the last attempt
	cost     int
}

type setCache struct {
	cfg   *Config
	res   LexiconResolver
	log   *slog.Logger
	slots chan struct{}
	group singleflight.Group
	// maxEntries and maxBytes bound the cache (maxCachedSets and
	// maxSetCacheBytes).
	maxEntries, maxBytes int

	mu    sync.Mutex
	items map[syntax.NSID]*setEntry
	bytes int
}

func newSetCache(cfg *Config) *setCache {
	return &setCache{cfg: cfg, res: cfg.Lexicons, log: cfg.Logger.With("component", "oauth"),
		slots: make(chan struct{}, maxSetResolutions), items: map[syntax.NSID]*setEntry{},
		maxEntries: maxCachedSets, maxBytes: maxSetCacheBytes}
}

func (sc *setCache) timeout() time.Duration {
	if sc.cfg.LexiconTimeout > 0 {
		return sc.cfg.LexiconTimeout
	}
	return DefaultLexiconTimeout
}

// cached answers from the cache when it can (ok).
func (sc *setCache) cached(nsid syntax.NSID, now time.Time) (set *permissionSet, err error, ok bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	e := sc.items[nsid]
	switch {
	case e == nil:
		return nil, nil, false
	case e.set != nil && now.Before(e.resolved.Add(setFreshFor)):
		return e.set, nil, true
	case now.Before(e.tried.Add(setFailureTTL)):
		if e.set != nil && now.Before(e.resolved.Add(setUsableFor)) {
			return e.set, nil, true
		}
		return nil, e.err, true
	}
	return nil, nil, false
}

// peek is nsid's set if one is cached, whatever its age, without
// resolving anything.
func (sc *setCache) peek(nsid syntax.NSID) *permissionSet {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if e := sc.items[nsid]; e != nil {
		return e.set
	}
	return nil
}

// get returns nsid's set. Errors are *Error values: invalid_scope naming
// the set, or 503 when too many other sets are being resolved.
func (sc *setCache) get(ctx context.Context, nsid syntax.NSID) (*permissionSet, error) {
	if set, err, ok := sc.cached(nsid, sc.cfg.Now()); ok {
		return set, err
	}
	v, err, _ := sc.group.Do(string(nsid), func() (any, error) {
		if set, err, ok := sc.cached(nsid, sc.cfg.Now()); ok {
			return set, err
		}
		select {
		case sc.slots <- struct{}{}:
			defer func() { <-sc.slots }()
		default:
			return nil, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
				Description: "too many permission sets are being resolved; retry shortly", retryAfter: busyRetry}
		}
		// A context of its own: one caller giving up must not fail the
		// others waiting on the same resolution.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.timeout())
		defer cancel()
		set, err := sc.resolve(rctx, nsid)
		return sc.record(nsid, set, err)
	})
	if err != nil {
		return nil, err
	}
	return v.(*permissionSet), nil
}

// resolve fetches and parses nsid's set.
func (sc *setCache) resolve(ctx context.Context, nsid syntax.NSID) (*permissionSet, error) {
	doc, err := sc.res.ResolveLexicon(ctx, nsid)
	if err != nil {
		sc.log.Info("permission set not resolved", "nsid", nsid, "err", err)
		e := oauthErr(http.StatusBadRequest, CodeInvalidScope, "the permission set %s could not be resolved", nsid)
		e.cause = err
		return nil, e
	}
	set, err := parsePermissionSet(nsid, doc)
	if err != nil {
		sc.log.Info("permission set refused", "nsid", nsid, "err", err)
		e := oauthErr(http.StatusBadRequest, CodeInvalidScope, "%s is not a usable permission set", nsid)
		e.cause = err
		return nil, e
	}
	return set, nil
}

// record caches a resolution's outcome and returns what get answers: on a
// failure, the set already known while it is usable.
func (sc *setCache) record(nsid syntax.NSID, set *permissionSet, err error) (*permissionSet, error) {
	now := sc.cfg.Now()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	e := &setEntry{set: set, resolved: now, tried: now}
	if err != nil {
		e.set, e.err = nil, err
		if old := sc.items[nsid]; old != nil && old.set != nil && now.Before(old.resolved.Add(setUsableFor)) {
			e.set, e.resolved = old.set, old.resolved
			sc.log.Warn("permission set not refreshed; using the one resolved before", "nsid", nsid, "resolved", old.resolved, "err", err)
		}
	}
	e.cost = len(nsid) + 256
	if e.set != nil {
		e.cost += e.set.size()
	}
	sc.store(nsid, e)
	if e.set != nil {
		return e.set, nil
	}
	return nil, err
}

// store caches e, first making room when the cache is full: expired
// entries go, then others, until it is three quarters full. sc.mu is held.
func (sc *setCache) store(nsid syntax.NSID, e *setEntry) {
	sc.remove(nsid)
	if len(sc.items) >= sc.maxEntries || sc.bytes+e.cost > sc.maxBytes {
		now := sc.cfg.Now()
		for k, old := range sc.items {
			if !now.Before(old.tried.Add(setFailureTTL)) && (old.set == nil || !now.Before(old.resolved.Add(setUsableFor))) {
				sc.remove(k)
			}
		}
		for k := range sc.items {
			if len(sc.items) <= sc.maxEntries*3/4 && sc.bytes+e.cost <= sc.maxBytes*3/4 {
				break
			}
			sc.remove(k)
		}
	}
	sc.items[nsid] = e
	sc.bytes += e.cost
}

func (sc *setCache) remove(nsid syntax.NSID) {
	if old, ok := sc.items[nsid]; ok {
		sc.bytes -= old.cost
		delete(sc.items, nsid)
	}
}

// getAll resolves the sets of incs at once.
func (sc *setCache) getAll(ctx context.Context, incs []include) (map[syntax.NSID]*permissionSet, error) {
	sets := make(map[syntax.NSID]*permissionSet, len(incs))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, inc := range incs {
		mu.Lock()
		_, dup := sets[inc.NSID]
		sets[inc.NSID] = nil
		mu.Unlock()
		if dup {
			continue
		}
		g.Go(func() error {
			set, err := sc.get(gctx, inc.NSID)
			if err != nil {
				return err
			}
			mu.Lock()
			sets[inc.NSID] = set
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sets, nil
}
