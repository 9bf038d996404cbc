package pds

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/proxy"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Admission of proxied requests. A proxied request holds memory (its
// share of the in-flight budget, proxyReserve) for as long as the service
// it goes to takes to answer, and a service an atproto-proxy header names
// is anyone's: one that sends its headers and then a byte now and then
// would hold that share as long as it liked. The proxy bounds each answer
// in time (--proxy-total-timeout, --proxy-min-rate); here, how many may
// be held at once:
//
//   - per client: at most --proxy-max-per-client proxied requests in
//     flight, waiting or answering, counted per account for a signed-in
//     caller and per address (an IPv6 /64 counting as one) for anyone
//     else; the next is 429 RateLimitExceeded at once, before the target
//     is resolved;
//   - per pool: proxied requests draw on the in-flight budget only
//     through pools of their own, so that however slow the services they
//     go to, getRepo exports, blob downloads and the other reads of the
//     budget keep at least three eighths of it. The operator's services
//     (the app view, the moderation and report services) share half of
//     the budget, services a header names an eighth; of each, anonymous
//     callers' requests may hold only a quarter, so that many addresses
//     together starve neither the server's own reads nor signed-in
//     callers' timelines and chat, whatever they ask that is slow to
//     answer. A pool that is full queues its requests first come, first
//     served (--inflight-queue), as the budget does.
const (
	// configuredPoolShare, headerPoolShare, anonymousConfiguredShare and
	// anonymousHeaderShare are the pools' sizes as fractions (1/n) of the
	// in-flight budget.
	configuredPoolShare      = 2
	headerPoolShare          = 8
	anonymousConfiguredShare = 8
	anonymousHeaderShare     = 32
	// perClientRetryAfter is the Retry-After of a per-client refusal: a
	// client's proxied requests end within seconds.
	perClientRetryAfter = time.Second
)

// proxyAdmission is the per-client count and the pools.
type proxyAdmission struct {
	maxPerClient int

	mu     sync.Mutex
	active map[string]int // client key → requests in flight; no zero entries

	// configured and header are the pools, anonConfigured and
	// anonHeader anonymous callers' shares of them (nil without a budget:
	// everything is admitted). Each request reserves from its pools,
	// smallest first, then from the budget itself.
	configured, header, anonConfigured, anonHeader *budget.Budget
	main                                           *budget.Budget
}

func newProxyAdmission(maxPerClient, queue int, main *budget.Budget) *proxyAdmission {
	if maxPerClient < 1 {
		maxPerClient = config.DefaultProxyMaxPerClient
	}
	a := &proxyAdmission{maxPerClient: maxPerClient, active: map[string]int{}, main: main}
	if main == nil {
		return a
	}
	if queue == 0 {
		queue = -1 // no waiting, as budget.Config says it
	}
	capacity := main.Stats().Capacity
	pool := func(share int64) *budget.Budget {
		return budget.New(budget.Config{Capacity: max(capacity/share, proxyReserve), MaxQueue: queue})
	}
	a.configured, a.header = pool(configuredPoolShare), pool(headerPoolShare)
	a.anonConfigured, a.anonHeader = pool(anonymousConfiguredShare), pool(anonymousHeaderShare)
	return a
}

// enter counts one more proxied request of client, or refuses it with 429
// when the client has maxPerClient in flight. leave undoes it.
func (a *proxyAdmission) enter(client string) (leave func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.active[client] >= a.maxPerClient {
		e := newError(http.StatusTooManyRequests, "RateLimitExceeded",
			"too many proxied requests in flight from this client (at most %d at once); retry when one has been answered", a.maxPerClient)
		e.Header = http.Header{ratelimit.HeaderRetryAfter: {strconv.FormatInt(ratelimit.RetryAfterSeconds(perClientRetryAfter), 10)}}
		return nil, e
	}
	a.active[client]++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.active[client]--; a.active[client] <= 0 {
				delete(a.active, client)
			}
		})
	}, nil
}

// budgets are what a request to t from c reserves from, in order: its
// pools, then the in-flight budget.
func (a *proxyAdmission) budgets(t proxy.Target, c proxy.Caller) []*budget.Budget {
	switch {
	case a.main == nil:
		return nil
	case t.Configured && c.Authenticated:
		return []*budget.Budget{a.configured, a.main}
	case t.Configured:
		return []*budget.Budget{a.anonConfigured, a.configured, a.main}
	case c.Authenticated:
		return []*budget.Budget{a.header, a.main}
	default:
		return []*budget.Budget{a.anonHeader, a.header, a.main}
	}
}

// proxyClientKey is who a proxied request counts against: the account of
// a signed-in caller (many people share an address behind a carrier's
// NAT), the address of anyone else.
func (s *Server) proxyClientKey(r *http.Request, c proxy.Caller) string {
	if c.Authenticated && c.DID != "" {
		return "did " + c.DID.String()
	}
	return "ip " + s.ipKey(r)
}
