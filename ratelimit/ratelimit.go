package ratelimit

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxKeys bounds the keys one Limiter tracks when Config.MaxKeys is
// zero. An entry costs about 150 bytes with one rule (measured by
// BenchmarkAllowDistinctKeys), so a full table is under 10 MB.
const DefaultMaxKeys = 50_000

// numShards splits a Limiter's table so that concurrent requests for
// different keys rarely contend on one mutex.
const numShards = 16

// sweepPerInsert is how many least-recently-seen entries a new key checks
// for expiry: enough to keep up with the arrival rate, bounded so that an
// insert costs O(1).
const sweepPerInsert = 4

// Rule is one limit: at most Limit points per Window, e.g. {"5m", 3000,
// 5 * time.Minute}.
type Rule struct {
	// Name identifies the rule within its limiter, in metrics and logs.
	Name string
	// Limit is the points allowed per Window (and the burst).
	Limit int
	// Window is the period over which Limit points refill.
	Window time.Duration
}

// String is the rule as ParseRules reads it, like "3000/5m0s".
func (r Rule) String() string { return fmt.Sprintf("%d/%v", r.Limit, r.Window) }

// perNano is the refill rate in points per nanosecond.
func (r Rule) perNano() float64 { return float64(r.Limit) / float64(r.Window) }

// Config describes a Limiter.
type Config struct {
	// Name identifies the limiter in metrics and logs, like "global" or
	// "createSession".
	Name string
	// Rules are the limits a key must satisfy, all of them, on every call.
	// A Limiter with no rules allows everything.
	Rules []Rule
	// MaxKeys bounds the keys tracked at once (default DefaultMaxKeys).
	MaxKeys int
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
}

// Limiter applies a set of rules to keys (client IPs, DIDs, identifier+IP).
// It is safe for concurrent use. A nil *Limiter allows everything.
type Limiter struct {
	name    string
	rules   []Rule
	rates   []float64
	maxIdle int64 // ns after which any key's buckets are all full again
	now     func() time.Time
	epoch   time.Time
	seed    maphash.Seed
	shards  [numShards]shard

	allowed atomic.Uint64
	refused []atomic.Uint64 // per rule
	evicted atomic.Uint64
}

type shard struct {
	mu      sync.Mutex
	entries map[string]*entry
	// head is the most recently seen entry, tail the least; an intrusive
	// list saves an allocation per key over container/list.
	head, tail *entry
	max        int
}

type entry struct {
	key        string
	last       int64 // ns since the limiter's epoch
	tokens     []float64
	prev, next *entry
}

// New returns a Limiter for cfg. It fails on a rule with a non-positive
// limit or window, and on duplicate rule names.
func New(cfg Config) (*Limiter, error) {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{
		name:    cfg.Name,
		rules:   append([]Rule(nil), cfg.Rules...),
		now:     cfg.Now,
		seed:    maphash.MakeSeed(),
		refused: make([]atomic.Uint64, len(cfg.Rules)),
	}
	l.epoch = l.now()
	seen := map[string]bool{}
	for i, r := range l.rules {
		if r.Limit <= 0 || r.Window <= 0 {
			return nil, fmt.Errorf("ratelimit %s: rule %q: limit and window must be positive, got %v", cfg.Name, r.Name, r)
		}
		if r.Name == "" {
			r.Name = r.Window.String()
			l.rules[i] = r
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("ratelimit %s: duplicate rule name %q", cfg.Name, r.Name)
		}
		seen[r.Name] = true
		l.rates = append(l.rates, r.perNano())
		l.maxIdle = max(l.maxIdle, int64(r.Window))
	}
	perShard := (cfg.MaxKeys + numShards - 1) / numShards
	for i := range l.shards {
		l.shards[i].entries = map[string]*entry{}
		l.shards[i].max = perShard
	}
	return l, nil
}

// MustNew is New for rules known at compile time; it panics on an error.
func MustNew(cfg Config) *Limiter {
	l, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return l
}

// Name returns the limiter's name.
func (l *Limiter) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Rules returns the limiter's rules.
func (l *Limiter) Rules() []Rule {
	if l == nil {
		return nil
	}
	return append([]Rule(nil), l.rules...)
}

// Decision is the outcome of one call, with what the RateLimit-* headers
// report.
type Decision struct {
	// Allowed says whether the call may proceed.
	Allowed bool
	// Rule is the rule the headers describe: the one that refused (the one
	// with the longest wait if several did), or, when allowed, the one with
	// the fewest points left. Zero when the limiter has no rules.
	Rule Rule
	// Remaining is the points left under Rule after this call.
	Remaining int
	// Reset is how long until Rule's bucket is full again.
	Reset time.Duration
	// RetryAfter is, when refused, how long until the call would be
	// allowed; zero when allowed.
	RetryAfter time.Duration
}

// Allow spends one point for key.
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration, remaining int) {
	d := l.AllowN(key, 1)
	return d.Allowed, d.RetryAfter, d.Remaining
}

// AllowN spends points for key (the cost of this call, e.g. 3 for a record
// create) if every rule has that many left; otherwise it spends nothing and
// says how long to wait. A cost larger than a rule's Limit can never be
// allowed; it is refused with RetryAfter equal to that rule's window.
func (l *Limiter) AllowN(key string, points int) Decision {
	if l == nil || len(l.rules) == 0 {
		return Decision{Allowed: true, Remaining: math.MaxInt32}
	}
	points = max(points, 0)
	now := int64(l.now().Sub(l.epoch))
	sh := &l.shards[maphash.String(l.seed, key)%numShards]

	sh.mu.Lock()
	e := sh.get(l, key, now)
	refill(e, l, now)
	refusedBy := -1
	var retry time.Duration
	for i, r := range l.rules {
		if e.tokens[i] >= float64(points) {
			continue
		}
		wait := r.Window
		if points <= r.Limit {
			wait = durationCeil((float64(points) - e.tokens[i]) / l.rates[i])
		}
		if refusedBy < 0 || wait > retry {
			refusedBy, retry = i, wait
		}
	}
	if refusedBy >= 0 {
		d := l.describe(e, refusedBy)
		sh.mu.Unlock()
		d.RetryAfter = retry
		l.refused[refusedBy].Add(1)
		return d
	}
	binding := 0
	for i := range l.rules {
		e.tokens[i] -= float64(points)
		if e.tokens[i] < e.tokens[binding] || e.tokens[i] == e.tokens[binding] && l.rules[i].Window > l.rules[binding].Window {
			binding = i
		}
	}
	d := l.describe(e, binding)
	sh.mu.Unlock()
	d.Allowed = true
	l.allowed.Add(1)
	return d
}

// describe fills a Decision for rule i of e. Called with the shard locked.
func (l *Limiter) describe(e *entry, i int) Decision {
	r := l.rules[i]
	return Decision{
		Rule:      r,
		Remaining: int(math.Floor(e.tokens[i])),
		Reset:     durationCeil((float64(r.Limit) - e.tokens[i]) / l.rates[i]),
	}
}

func durationCeil(ns float64) time.Duration {
	if ns <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(ns))
}

// refill adds the points earned since e was last seen.
func refill(e *entry, l *Limiter, now int64) {
	elapsed := now - e.last
	if elapsed <= 0 {
		return
	}
	for i, r := range l.rules {
		e.tokens[i] = min(float64(r.Limit), e.tokens[i]+float64(elapsed)*l.rates[i])
	}
	e.last = now
}

// get finds key's entry, creating it with full buckets, and marks it most
// recently seen. Called with sh.mu held.
func (sh *shard) get(l *Limiter, key string, now int64) *entry {
	if e, ok := sh.entries[key]; ok {
		sh.moveToFront(e)
		return e
	}
	sh.sweep(l, now)
	e := &entry{key: key, last: now, tokens: make([]float64, len(l.rules))}
	for i, r := range l.rules {
		e.tokens[i] = float64(r.Limit)
	}
	sh.entries[key] = e
	sh.pushFront(e)
	return e
}

// sweep forgets a few least recently seen entries whose buckets are full
// again (they hold no information), then, while the shard is full, the
// least recently seen entries whatever their state.
func (sh *shard) sweep(l *Limiter, now int64) {
	for range sweepPerInsert {
		e := sh.tail
		if e == nil || now-e.last < l.maxIdle {
			break
		}
		sh.remove(e)
	}
	for len(sh.entries) >= sh.max && sh.tail != nil {
		sh.remove(sh.tail)
		l.evicted.Add(1)
	}
}

func (sh *shard) pushFront(e *entry) {
	e.prev, e.next = nil, sh.head
	if sh.head != nil {
		sh.head.prev = e
	}
	sh.head = e
	if sh.tail == nil {
		sh.tail = e
	}
}

func (sh *shard) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (sh *shard) moveToFront(e *entry) {
	if sh.head == e {
		return
	}
	sh.unlink(e)
	sh.pushFront(e)
}

func (sh *shard) remove(e *entry) {
	sh.unlink(e)
	delete(sh.entries, e.key)
}

// Refund gives points back to key, up to each rule's limit: for limits
// that count only failures (an admin password guess, a login that did not
// succeed), a call spends its points before the work, so that concurrent
// calls cannot all pass a check together, and refunds them when the work
// succeeds. A key no longer tracked is left alone (its buckets are full).
func (l *Limiter) Refund(key string, points int) {
	if l == nil || len(l.rules) == 0 || points <= 0 {
		return
	}
	now := int64(l.now().Sub(l.epoch))
	sh := &l.shards[maphash.String(l.seed, key)%numShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.entries[key]
	if !ok {
		return
	}
	refill(e, l, now)
	for i, r := range l.rules {
		e.tokens[i] = min(float64(r.Limit), e.tokens[i]+float64(points))
	}
}

// Len returns the number of keys tracked.
func (l *Limiter) Len() int {
	if l == nil {
		return 0
	}
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// Prune forgets every key whose buckets are full again. AllowN already
// does this a little at a time; Prune is for a periodic tidy-up of a
// limiter that has gone quiet, so its memory is returned.
func (l *Limiter) Prune() {
	if l == nil {
		return
	}
	now := int64(l.now().Sub(l.epoch))
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for e := sh.tail; e != nil && now-e.last >= l.maxIdle; e = sh.tail {
			sh.remove(e)
		}
		sh.mu.Unlock()
	}
}

// Stats are a Limiter's counters, for metrics.
type Stats struct {
	// Name is the limiter's name.
	Name string
	// Keys is the number of keys tracked now.
	Keys int
	// Allowed counts allowed calls.
	Allowed uint64
	// Refused counts refused calls by the rule that refused them.
	Refused map[string]uint64
	// Evicted counts keys forgotten before their buckets refilled because
	// the table was full: a sign of a flood from many keys, or of MaxKeys
	// set too low.
	Evicted uint64
}

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	if l == nil {
		return Stats{}
	}
	s := Stats{
		Name:    l.name,
		Keys:    l.Len(),
		Allowed: l.allowed.Load(),
		Refused: make(map[string]uint64, len(l.rules)),
		Evicted: l.evicted.Load(),
	}
	for i, r := range l.rules {
		s.Refused[r.Name] = l.refused[i].Load()
	}
	return s
}

// ErrBadRule is returned by ParseRules for a malformed rule.
var ErrBadRule = errors.New("bad rate limit rule")
