package firehose

import (
	"container/list"
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Admission refusals. Each is answered before the WebSocket upgrade and
// before any database work, with a Retry-After from Admit.
var (
	// ErrRateLimited means the client opened more connections than its
	// token bucket allows.
	ErrRateLimited = errors.New("too many subscribeRepos connections from this client")
	// ErrTooManyFromClient means the client already holds its maximum of
	// concurrent subscriptions.
	ErrTooManyFromClient = errors.New("too many concurrent subscriptions from this client")
	// ErrServerFull means the server holds its maximum of concurrent
	// subscriptions.
	ErrServerFull = errors.New("too many concurrent subscriptions on this server")
)

// AdmissionConfig tunes subscribeRepos admission. The zero value is the
// documented default (1 per minute, burst 5).
type AdmissionConfig struct {
	// Rate is connections per second refilled into each client's bucket
	// (default 1/min). Relays redial at once after a failed connection, so
	// this is what turns a reconnect loop into one connection a minute.
	Rate rate.Limit
	// Burst is the bucket size (default 5).
	Burst int
	// Allow lists networks (known relays) exempt from the rate and the
	// per-client cap; they still count against MaxSubscribers.
	Allow []netip.Prefix
	// MaxSubscribers caps concurrent subscriptions on this process
	// (default 5000).
	MaxSubscribers int
	// MaxPerClient caps concurrent subscriptions from one client (default 8).
	MaxPerClient int
	// MaxClients caps the clients remembered at once (default 65536): a
	// flood from many addresses evicts the least recently seen idle ones
	// instead of growing the table.
	MaxClients int
}

func (c *AdmissionConfig) defaults() {
	if c.Rate <= 0 {
		c.Rate = rate.Every(time.Minute)
	}
	if c.Burst <= 0 {
		c.Burst = 5
	}
	if c.MaxSubscribers <= 0 {
		c.MaxSubscribers = 5000
	}
	if c.MaxPerClient <= 0 {
		c.MaxPerClient = 8
	}
	if c.MaxClients <= 0 {
		c.MaxClients = 65536
	}
}

// Admission decides whether a client may open a subscription. It holds
// everything in memory, per process (documented as per-node state): one
// token bucket and one connection count per client, in a table whose size
// is bounded.
type Admission struct {
	cfg AdmissionConfig
	// idle is how long an unused bucket takes to refill completely; after
	// that it carries no information and can be forgotten.
	idle time.Duration

	mu      sync.Mutex
	clients map[netip.Addr]*list.Element // of *client
	lru     list.List                    // front: most recently seen
	active  int
}

type client struct {
	key    netip.Addr
	bucket *rate.Limiter
	active int
	seen   time.Time
}

// NewAdmission returns an admission controller for cfg.
func NewAdmission(cfg AdmissionConfig) *Admission {
	cfg.defaults()
	idle := time.Duration(float64(cfg.Burst) / float64(cfg.Rate) * float64(time.Second))
	return &Admission{cfg: cfg, idle: idle, clients: map[netip.Addr]*list.Element{}}
}

// Ticket is an admitted subscription. Release it when the subscription
// ends.
type Ticket struct {
	a    *Admission
	c    *client
	once sync.Once
}

// Release returns the ticket's concurrency slots. Safe to call twice.
func (t *Ticket) Release() {
	t.once.Do(func() {
		t.a.mu.Lock()
		defer t.a.mu.Unlock()
		t.a.active--
		if t.c != nil {
			t.c.active--
		}
	})
}

// clientKey is the address limits apply to: the whole /64 for IPv6, since
// one host commonly holds that many addresses.
func clientKey(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

func (a *Admission) allowed(ip netip.Addr) bool {
	for _, p := range a.cfg.Allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Admit decides on a new subscription from ip at now. On refusal it returns
// one of the errors above and how long the client should wait, and counts
// the refusal in bulwark_firehose_upgrades_refused_total. It does no I/O
// and allocates only when it meets a new client.
func (a *Admission) Admit(ip netip.Addr, now time.Time) (*Ticket, time.Duration, error) {
	ip = ip.Unmap()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.active >= a.cfg.MaxSubscribers {
		refusedServerFull.Inc()
		return nil, 10 * time.Second, ErrServerFull
	}
	if a.allowed(ip) {
		a.active++
		return &Ticket{a: a}, 0, nil
	}
	c := a.lookup(clientKey(ip), now)
	if c.active >= a.cfg.MaxPerClient {
		refusedPerClient.Inc()
		return nil, time.Minute, ErrTooManyFromClient
	}
	r := c.bucket.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		// Do not consume the token: a client that keeps hammering must not
		// push its own next admission further away than the rate says.
		r.CancelAt(now)
		refusedRateLimited.Inc()
		return nil, d, ErrRateLimited
	}
	c.active++
	a.active++
	return &Ticket{a: a, c: c}, 0, nil
}

// Forgive gives the client at ip (an address as Health records it) a full
// bucket: its next subscription is admitted at once. Health calls it when
// the event the client was stuck on is repaired, so that a client refused
// while it was stuck is not kept waiting for its bucket to refill. The
// concurrency caps still apply.
func (a *Admission) Forgive(ip string) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return
	}
	key := clientKey(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.clients[key]; ok {
		c := el.Value.(*client)
		c.bucket = rate.NewLimiter(a.cfg.Rate, a.cfg.Burst)
	}
}

// lookup finds or creates key's entry, marks it seen, and keeps the table
// within MaxClients. Called with a.mu held.
func (a *Admission) lookup(key netip.Addr, now time.Time) *client {
	if el, ok := a.clients[key]; ok {
		c := el.Value.(*client)
		c.seen = now
		a.lru.MoveToFront(el)
		return c
	}
	a.evict(now)
	c := &client{key: key, bucket: rate.NewLimiter(a.cfg.Rate, a.cfg.Burst), seen: now}
	a.clients[key] = a.lru.PushFront(c)
	return c
}

// evict forgets clients idle long enough for a full bucket, and, while the
// table is full, the least recently seen clients without a subscription.
// Forgetting a client early gives it a fresh bucket, so it only happens
// when something is flooding from more addresses than the table holds.
func (a *Admission) evict(now time.Time) {
	el := a.lru.Back()
	for checked := 0; el != nil && checked < 64; checked++ {
		prev := el.Prev()
		c := el.Value.(*client)
		full := len(a.clients) >= a.cfg.MaxClients
		if c.active == 0 && (full || now.Sub(c.seen) > a.idle) {
			a.lru.Remove(el)
			delete(a.clients, c.key)
		} else if !full {
			break
		}
		el = prev
	}
}

// Clients returns how many clients the table remembers (for tests and
// metrics).
func (a *Admission) Clients() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.clients)
}

// Active returns the number of admitted subscriptions not yet released.
func (a *Admission) Active() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.active
}
