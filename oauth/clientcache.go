package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// The client metadata cache: every https client_id costs a fetch, so
// fetches are cached (failures too, briefly), concurrent requests for one
// client_id share one fetch, at most maxConcurrentFetches run at once, and
// the cache is bounded in entries and in bytes.
const (
	// failureCacheTTL keeps a failed fetch from being retried at once.
	failureCacheTTL = 30 * time.Second
	// maxCachedClients bounds the cache's entries.
	maxCachedClients = 10_000
	// maxCacheBytes bounds what the cached clients hold, counted as
	// entryCost does.
	maxCacheBytes = 16 << 20
	// maxConcurrentFetches bounds the distinct client_ids being fetched at
	// once: a request for another one meanwhile is refused (503), not
	// queued, so slow metadata servers cannot pile up requests and
	// connections here.
	maxConcurrentFetches = 32
	// busyRetry is the Retry-After of that refusal.
	busyRetry = 5 * time.Second
)

type cacheEntry struct {
	client  *client
	err     error
	expires time.Time
	cost    int
}

// entryCost is what an entry is charged against maxCacheBytes: its key,
// twice the bytes fetched (the document as parsed), and a fixed share
// for the rest.
func entryCost(clientID string, fetched int) int { return len(clientID) + 2*fetched + 1024 }

type clientCache struct {
	cfg     *Config
	http    *http.Client
	log     *slog.Logger
	fetches chan struct{}
	group   singleflight.Group

	mu    sync.Mutex
	items map[string]*cacheEntry
	bytes int
}

func newClientCache(cfg *Config) *clientCache {
	hc := *cfg.HTTPClient
	// The profile wants a 200 from the client_id URL itself, not a redirect.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &clientCache{cfg: cfg, http: &hc, log: cfg.Logger.With("component", "oauth"),
		fetches: make(chan struct{}, maxConcurrentFetches), items: make(map[string]*cacheEntry)}
}

func (cc *clientCache) ttl() time.Duration {
	if cc.cfg.ClientCacheTTL > 0 {
		return cc.cfg.ClientCacheTTL
	}
	return DefaultClientCacheTTL
}

func (cc *clientCache) fetchTimeout() time.Duration {
	if cc.cfg.FetchTimeout > 0 {
		return cc.cfg.FetchTimeout
	}
	return DefaultFetchTimeout
}

// lookup returns the live entry for clientID, or nil.
func (cc *clientCache) lookup(clientID string) *cacheEntry {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if e, ok := cc.items[clientID]; ok && cc.cfg.Now().Before(e.expires) {
		return e
	}
	return nil
}

// get returns the client for clientID, from the cache or freshly fetched.
// Errors are *Error values for the client (invalid_client), or a 503
// when too many other fetches are running.
func (cc *clientCache) get(ctx context.Context, clientID string) (*client, error) {
	if e := cc.lookup(clientID); e != nil {
		return e.client, e.err
	}
	v, err, _ := cc.group.Do(clientID, func() (any, error) {
		// A fetch that ended just before this call began has been stored.
		if e := cc.lookup(clientID); e != nil {
			return e.client, e.err
		}
		select {
		case cc.fetches <- struct{}{}:
			defer func() { <-cc.fetches }()
		default:
			return nil, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
				Description: "too many client metadata documents are being fetched; retry shortly", retryAfter: busyRetry}
		}
		// Fetch with a context of its own: one caller giving up must not
		// fail the others waiting on the same fetch.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cc.fetchTimeout())
		defer cancel()
		c, size, err := cc.load(fctx, clientID)
		e := &cacheEntry{client: c, err: err, expires: cc.cfg.Now().Add(cc.ttl()), cost: entryCost(clientID, size)}
		if err != nil {
			e.client, e.expires = nil, cc.cfg.Now().Add(failureCacheTTL)
		}
		cc.store(clientID, e)
		return c, err
	})
	if err != nil {
		return nil, err
	}
	return v.(*client), nil
}

// store caches e, first making room when the cache is full: expired
// entries go, then others, until it is three quarters full.
func (cc *clientCache) store(clientID string, e *cacheEntry) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.remove(clientID)
	if len(cc.items) >= maxCachedClients || cc.bytes+e.cost > maxCacheBytes {
		now := cc.cfg.Now()
		for k, old := range cc.items {
			if !now.Before(old.expires) {
				cc.remove(k)
			}
		}
		for k := range cc.items {
			if len(cc.items) <= maxCachedClients*3/4 && cc.bytes+e.cost <= maxCacheBytes*3/4 {
				break
			}
			cc.remove(k)
		}
	}
	cc.items[clientID] = e
	cc.bytes += e.cost
}

// remove drops clientID's entry; cc.mu is held.
func (cc *clientCache) remove(clientID string) {
	if old, ok := cc.items[clientID]; ok {
		cc.bytes -= old.cost
		delete(cc.items, clientID)
	}
}

// ForgetClient drops a client's cached metadata, so the next request
// fetches it again (for an operator told that a client rotated a
// compromised key).
func (s *Server) ForgetClient(clientID string) {
	s.clients.mu.Lock()
	defer s.clients.mu.Unlock()
	s.clients.remove(clientID)
}

// fetchError is a failed document fetch: public is what the client is
// told, in fixed words (nothing the fetch learned: no address, DNS answer,
// status line or body); err is the detail, for the log.
type fetchError struct {
	public string
	err    error
}

func (e *fetchError) Error() string { return e.public + ": " + e.err.Error() }

func (e *fetchError) Unwrap() error { return e.err }

// fetchFailed logs a failed fetch of what (at u, for clientID) and returns
// the invalid_client answer, which says only which document failed and
// the fetchError's fixed words.
func (cc *clientCache) fetchFailed(clientID, what, u string, err error) *Error {
	public := "could not be fetched"
	var fe *fetchError
	if errors.As(err, &fe) {
		public = fe.public
	}
	cc.log.Info("client document fetch failed", "client", clientID, "url", u, "err", err)
	e := invalidClient("%s %s", what, public)
	e.cause = err
	return e
}

// fetchJSON GETs an https document of at most MaxDocumentBytes that must
// answer exactly 200 with a JSON content type, and decodes it into v. n
// is the bytes read.
func (cc *clientCache) fetchJSON(ctx context.Context, u string, v any) (n int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, &fetchError{"is not at a valid URL", err}
	}
	req.Header.Set("Accept", "application/json")
	resp, err := cc.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, &fetchError{"could not be fetched in time", err}
		}
		return 0, &fetchError{"could not be fetched", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, &fetchError{"was not served with status 200", errors.New(resp.Status)}
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" {
		return 0, &fetchError{"is not served as application/json", errors.New("content type " + strconv.Quote(mt))}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDocumentBytes+1))
	if err != nil {
		return len(body), &fetchError{"could not be read", err}
	}
	if len(body) > MaxDocumentBytes {
		return len(body), &fetchError{"is larger than " + strconv.Itoa(MaxDocumentBytes) + " bytes", errors.New("too large")}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return len(body), &fetchError{"is not valid JSON of the expected shape", err}
	}
	return len(body), nil
}
