package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Rate limits and caps: what keeps anonymous requests and client apps from
// making the server store or fetch without bound. Every route spends a
// point of its per-address policy before any work; PAR, token and
// revocation also spend one of the client_id's, before its metadata is
// fetched. Pushed requests are capped per client and overall, and the
// single-use values they leave are trimmed to MaxUsedValues.

// CodeRateLimited is the error of a 429 from a JSON endpoint: the name the
// rest of the server's 429s carry.
const CodeRateLimited = "RateLimitExceeded"

// CodeUnavailable is the error of a 503: the server holds as many pending
// requests as it will, or fetches as many client documents as it will at
// once (RFC 6749's temporarily_unavailable).
const CodeUnavailable = "temporarily_unavailable"

// pendingRetry is the Retry-After of a refusal for too many pending
// requests: about when the oldest of them expire.
const pendingRetry = time.Minute

// clientAddr is the request's address as the rate limits see it.
func (s *Server) clientAddr(r *http.Request) netip.Addr {
	if s.cfg.ClientAddr != nil {
		return s.cfg.ClientAddr(r)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr, _ := netip.ParseAddr(host)
	return addr
}

// spend takes a point of policy for key, setting the RateLimit-* headers
// (and Retry-After when refused) on h. Without limits, or with the policy
// off, everything is allowed and no header is set.
func (s *Server) spend(h http.Header, policy, key string) (ratelimit.Decision, bool) {
	l := s.cfg.Limits.Get(policy)
	if l == nil {
		return ratelimit.Decision{Allowed: true}, true
	}
	d := l.AllowN(key, 1)
	for _, k := range []string{ratelimit.HeaderLimit, ratelimit.HeaderRemaining, ratelimit.HeaderReset, ratelimit.HeaderPolicy, ratelimit.HeaderRetryAfter} {
		h.Del(k)
	}
	ratelimit.SetHeaders(h, d, time.Now())
	return d, d.Allowed
}

// perAddress puts h under policy for the client's address. A refusal is
// answered as the route answers: a page for people, JSON for apps.
func (s *Server) perAddress(policy string, page bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d, ok := s.spend(w.Header(), policy, ratelimit.IPKey(s.clientAddr(r)))
		if ok {
			h(w, r)
			return
		}
		if page {
			s.errorPage(w, http.StatusTooManyRequests, "Too many requests",
				"This browser's network has made too many requests to the sign-in pages. Wait "+waitWords(d.RetryAfter)+", then try again.")
			return
		}
		s.writeError(w, r, rateLimited(policy, d))
	}
}

// perClient puts a request naming clientID under policy for that client,
// across all addresses. The key is a hash: client_ids are long and chosen
// by whoever sends them.
func (s *Server) perClient(w http.ResponseWriter, policy, clientID string) error {
	sum := sha256.Sum256([]byte(clientID))
	d, ok := s.spend(w.Header(), policy, base64.RawURLEncoding.EncodeToString(sum[:16]))
	if ok {
		return nil
	}
	return rateLimited(policy, d)
}

func rateLimited(policy string, d ratelimit.Decision) *Error {
	return oauthErr(http.StatusTooManyRequests, CodeRateLimited, "rate limit exceeded (%s, %s); retry in %d s",
		policy, d.Rule, ratelimit.RetryAfterSeconds(d.RetryAfter))
}

// waitWords says how long to wait, for a page.
func waitWords(d time.Duration) string {
	if d <= time.Minute {
		return "a minute"
	}
	return strconv.Itoa(int((d+time.Minute-1)/time.Minute)) + " minutes"
}

func (s *Server) pendingCaps() (perClient, overall int) {
	perClient, overall = s.cfg.MaxPendingPerClient, s.cfg.MaxPendingRequests
	if perClient <= 0 {
		perClient = DefaultMaxPendingPerClient
	}
	if overall <= 0 {
		overall = DefaultMaxPendingRequests
	}
	return perClient, overall
}

// checkPending refuses a new pushed request of clientID when the client,
// or the server, already holds as many unapproved requests as it may.
// Expired ones count until they are deleted, which happens here when they
// are in the way. It runs in the transaction that inserts the request,
// after taking the client's lock, so the per-client cap is exact; the
// overall one may be passed by the PARs of other clients in flight at the
// same moment (at most one each).
func (s *Server) checkPending(ctx context.Context, q db.DBTX, clientID string) error {
	perClient, overall := s.pendingCaps()
	if _, err := q.Exec(ctx, qLockClient, clientID); err != nil {
		return db.Translate(err)
	}
	for attempt := 0; ; attempt++ {
		var mine, all int
		if err := q.QueryRow(ctx, qCountPending, clientID, perClient, overall).Scan(&mine, &all); err != nil {
			return db.Translate(err)
		}
		if mine < perClient && all < overall {
			return nil
		}
		if attempt == 0 {
			if _, err := q.Exec(ctx, qDeleteExpiredRequests); err != nil {
				return db.Translate(err)
			}
			continue
		}
		if mine >= perClient {
			s.rarely(func() {
				s.log.Warn("pushed requests refused: a client has too many pending", "client", clientID, "cap", perClient)
			})
			return &Error{Status: http.StatusTooManyRequests, Code: CodeRateLimited,
				Description: "this client has too many authorization requests waiting; retry later", retryAfter: pendingRetry}
		}
		s.rarely(func() { s.log.Warn("pushed requests refused: too many pending overall", "cap", overall) })
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
			Description: "the server has too many authorization requests waiting; retry later", retryAfter: pendingRetry}
	}
}

// rarely runs warn at most once a minute (for warnings a flood would
// repeat at every request).
func (s *Server) rarely(warn func()) {
	now := time.Now().Unix()
	last := s.trim.warned.Load()
	if now-last >= 60 && s.trim.warned.CompareAndSwap(last, now) {
		warn()
	}
}

// valueTrim counts the single-use values this process recorded since it
// last trimmed them; its zero value is ready.
type valueTrim struct {
	since   atomic.Int64
	running atomic.Bool
	// warned is when rarely last warned (Unix seconds).
	warned atomic.Int64
}

func (s *Server) maxUsedValues() int {
	if s.cfg.MaxUsedValues > 0 {
		return s.cfg.MaxUsedValues
	}
	return DefaultMaxUsedValues
}

// trimEvery is how many single-use values a process records between
// trims: a tenth of the cap, at most 1000. The table holds at most the cap
// plus this many per process (and those of PARs in flight).
func (s *Server) trimEvery() int64 { return int64(min(1000, max(1, s.maxUsedValues()/10))) }

// recordedValues notes n single-use values recorded, and trims the table
// once trimEvery have been since the last trim. The request that crosses
// the mark pays for the trim: one indexed delete.
func (s *Server) recordedValues(ctx context.Context, n int) {
	if s.trim.since.Add(int64(n)) < s.trimEvery() || !s.trim.running.CompareAndSwap(false, true) {
		return
	}
	defer s.trim.running.Store(false)
	s.trim.since.Store(0)
	if err := s.trimValues(ctx); err != nil {
		s.log.Warn("trimming single-use values failed", "err", err)
	}
}

// trimValues deletes the oldest PKCE challenges and states beyond
// MaxUsedValues.
func (s *Server) trimValues(ctx context.Context) error {
	limit := s.maxUsedValues()
	tag, err := s.db.Exec(ctx, qTrimValues, limit)
	if err != nil {
		return db.Translate(err)
	}
	if n := tag.RowsAffected(); n > 0 {
		s.log.Warn("single-use values over the cap: the oldest forgotten early", "deleted", n, "cap", limit)
	}
	return nil
}
