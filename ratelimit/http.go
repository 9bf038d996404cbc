package ratelimit

import (
	"encoding/json"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Header names, as the reference PDS sends them (and as indigo's xrpc
// client reads them: RateLimit-Reset is a Unix time in seconds).
const (
	HeaderLimit      = "RateLimit-Limit"
	HeaderRemaining  = "RateLimit-Remaining"
	HeaderReset      = "RateLimit-Reset"
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRetryAfter = "Retry-After"
)

// SetHeaders reports d in h: RateLimit-Limit, -Remaining, -Reset (Unix
// seconds at which d.Rule's bucket is full again, counted from now) and
// -Policy ("limit;w=seconds"), plus Retry-After (whole seconds, at least
// 1) when d refused. A decision from a limiter without rules sets nothing.
func SetHeaders(h http.Header, d Decision, now time.Time) {
	if d.Rule.Limit == 0 {
		return
	}
	h.Set(HeaderLimit, strconv.Itoa(d.Rule.Limit))
	h.Set(HeaderRemaining, strconv.Itoa(max(d.Remaining, 0)))
	h.Set(HeaderReset, strconv.FormatInt(int64(math.Ceil(float64(now.Add(d.Reset).UnixNano())/1e9)), 10))
	h.Set(HeaderPolicy, strconv.Itoa(d.Rule.Limit)+";w="+strconv.FormatInt(int64(d.Rule.Window/time.Second), 10))
	if !d.Allowed {
		h.Set(HeaderRetryAfter, strconv.FormatInt(RetryAfterSeconds(d.RetryAfter), 10))
	}
}

// Headers returns the headers SetHeaders would set, as a fresh map: for an
// error value that carries its own headers (pds.XRPCError.Header), so that
// Retry-After is not set twice.
func Headers(d Decision, now time.Time) http.Header {
	h := http.Header{}
	SetHeaders(h, d, now)
	return h
}

// RetryAfterSeconds rounds a wait up to the whole seconds of a Retry-After
// header, at least 1: "0" would invite an immediate retry.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// Middleware limits next with l, keyed by key(r) (a request key of ""
// bypasses the limiter). An allowed request carries the RateLimit-*
// headers; a refused one is answered 429 RateLimitExceeded with
// Retry-After, without calling next. Routes whose cost depends on the
// request (write points) call AllowN and SetHeaders themselves instead.
func Middleware(l *Limiter, key func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := key(r)
		if l == nil || k == "" {
			next.ServeHTTP(w, r)
			return
		}
		d := l.AllowN(k, 1)
		SetHeaders(w.Header(), d, time.Now())
		if !d.Allowed {
			WriteRefusal(w, d)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteRefusal answers the XRPC error for a refused decision: 429
// {"error":"RateLimitExceeded"}. The RateLimit headers must already be set
// (SetHeaders).
func WriteRefusal(w http.ResponseWriter, d Decision) {
	body, _ := json.Marshal(struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}{"RateLimitExceeded", "Rate Limit Exceeded: " + d.Rule.String() + " (" + d.Rule.Name + ")"})
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n'))
}

// IPKey is the key for per-client limits on addr: the address itself for
// IPv4, its /64 for IPv6, since one host commonly holds a whole /64 and
// would otherwise get a fresh limit per address.
func IPKey(addr netip.Addr) string {
	addr = addr.Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// Key joins the parts of a compound key (createSession's identifier and
// IP) with a separator that cannot occur in either, so that ("a b", "c")
// and ("a", "b c") stay distinct.
func Key(parts ...string) string {
	return strings.Join(parts, "\x1f")
}
