package outbound

import (
	"context"
	"errors"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// ttlCache remembers lookups for a while, in a bounded LRU: answers for
// ttl, "not found" for notFoundTTL, other failures not at all. Concurrent
// lookups of one key share one fetch.
type ttlCache[K ~string, V any] struct {
	entries     *lru.Cache[K, cacheEntry[V]]
	group       singleflight.Group
	ttl         time.Duration
	notFoundTTL time.Duration
	notFound    error // errors.Is(err, notFound) marks a cacheable miss
	now         func() time.Time
}

type cacheEntry[V any] struct {
	val     V
	err     error
	expires time.Time
}

func newTTLCache[K ~string, V any](size int, ttl, notFoundTTL time.Duration, notFound error) *ttlCache[K, V] {
	entries, err := lru.New[K, cacheEntry[V]](size)
	if err != nil {
		panic(err) // only for size <= 0, which NewDirectory rules out
	}
	return &ttlCache[K, V]{entries: entries, ttl: ttl, notFoundTTL: notFoundTTL, notFound: notFound, now: time.Now}
}

// get returns key's cached answer, or fetches it. The fetch is detached
// from ctx's cancellation (others may be waiting for it; the fetch bounds
// itself) but a caller whose ctx ends stops waiting.
func (c *ttlCache[K, V]) get(ctx context.Context, key K, fetch func(context.Context) (V, error)) (V, error) {
	if e, ok := c.entries.Get(key); ok {
		if c.now().Before(e.expires) {
			return e.val, e.err
		}
		c.entries.Remove(key)
	}
	ch := c.group.DoChan(string(key), func() (any, error) {
		v, err := fetch(context.WithoutCancel(ctx))
		switch {
		case err == nil:
			c.entries.Add(key, cacheEntry[V]{val: v, expires: c.now().Add(c.ttl)})
		case errors.Is(err, c.notFound):
			c.entries.Add(key, cacheEntry[V]{err: err, expires: c.now().Add(c.notFoundTTL)})
		}
		return v, err
	})
	select {
	case r := <-ch:
		v, _ := r.Val.(V)
		return v, r.Err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// purge forgets key; a lookup after it fetches afresh, even while an
// earlier fetch is still running.
func (c *ttlCache[K, V]) purge(key K) {
	c.group.Forget(string(key))
	c.entries.Remove(key)
}
