package dpop

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"sync"
	"time"

	"github.com/bulwark-pds/bulwark/internal/keyring"
)

// Defaults for Config's zero values.
const (
	// DefaultNonceRotation: a nonce is issued for one window and accepted
	// for one more, so it lives at most two windows (4 minutes), under the
	// 5 minutes the atproto profile allows.
	DefaultNonceRotation = 2 * time.Minute
	// DefaultMaxAge is how old a proof's iat may be.
	DefaultMaxAge = 2 * time.Minute
	// DefaultLeeway is how far in the future a proof's iat may be (client
	// clocks run fast).
	DefaultLeeway = 30 * time.Second
	// DefaultReplayCapacity bounds the replay memory: about 40 bytes an
	// entry plus map overhead, so some tens of MiB at most.
	DefaultReplayCapacity = 1 << 18
)

// Config configures a Verifier. The zero value works except for Secret.
type Config struct {
	// Secret is the server secret the nonce key is derived from
	// (keyring.OAuthDPoPNonce); nodes that share it accept each other's
	// nonces. At least 32 bytes; empty means a random key for this
	// process only.
	Secret []byte
	// NonceRotation is how often the nonce changes. Zero means
	// DefaultNonceRotation; at most 2.5 minutes keeps a nonce's life within
	// the profile's 5 minutes.
	NonceRotation time.Duration
	// MaxAge is how old a proof's iat may be. Zero means DefaultMaxAge.
	MaxAge time.Duration
	// Leeway is how far ahead of the server's clock a proof's iat may be.
	// Zero means DefaultLeeway.
	Leeway time.Duration
	// ReplayCapacity bounds how many proof ids are remembered. Zero means
	// DefaultReplayCapacity. When it is full the oldest id is forgotten.
	ReplayCapacity int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Verifier verifies DPoP proofs and issues nonces. Safe for concurrent use.
type Verifier struct {
	cfg    Config
	key    []byte
	replay *replayCache
}

// NewVerifier returns a Verifier for cfg.
func NewVerifier(cfg Config) *Verifier {
	if cfg.NonceRotation <= 0 {
		cfg.NonceRotation = DefaultNonceRotation
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = DefaultLeeway
	}
	if cfg.ReplayCapacity <= 0 {
		cfg.ReplayCapacity = DefaultReplayCapacity
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	key := randomBytes(32)
	if len(cfg.Secret) > 0 {
		key = keyring.MustNew(cfg.Secret).Key(keyring.OAuthDPoPNonce)
	}
	return &Verifier{
		cfg: cfg,
		key: key,
		// A proof is accepted while its iat is in [now-MaxAge, now+Leeway],
		// so its id must be remembered for that long after it is first seen.
		replay: newReplayCache(cfg.ReplayCapacity, cfg.MaxAge+cfg.Leeway),
	}
}

func (v *Verifier) now() time.Time { return v.cfg.Now() }

// Nonce returns the current server nonce, for the DPoP-Nonce header.
func (v *Verifier) Nonce() string { return v.nonceAt(v.window(v.now())) }

func (v *Verifier) window(t time.Time) int64 {
	return t.UnixNano() / int64(v.cfg.NonceRotation)
}

func (v *Verifier) nonceAt(window int64) string {
	mac := hmac.New(sha256.New, v.key)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(window))
	mac.Write(b[:])
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:16])
}

// nonceValid accepts the current window's nonce, the previous one (a
// client with requests in flight across a rotation) and the next one (a
// node whose clock runs slightly ahead issued it).
func (v *Verifier) nonceValid(nonce string, now time.Time) bool {
	w := v.window(now)
	for _, c := range []int64{w, w - 1, w + 1} {
		if hmac.Equal([]byte(nonce), []byte(v.nonceAt(c))) {
			return true
		}
	}
	return false
}

// replayCache remembers proof ids until they can no longer be accepted.
// Entries expire in insertion order (every entry lives for the same ttl),
// so a FIFO queue is enough to purge them.
type replayCache struct {
	mu    sync.Mutex
	cap   int
	ttl   time.Duration
	seen  map[[16]byte]struct{}
	queue []replayEntry
	head  int
}

type replayEntry struct {
	key     [16]byte
	expires time.Time
}

func newReplayCache(capacity int, ttl time.Duration) *replayCache {
	return &replayCache{cap: capacity, ttl: ttl, seen: make(map[[16]byte]struct{})}
}

// add records (jkt, jti) and reports whether it was new. Ids are scoped to
// the key: two clients choosing the same jti do not collide.
func (c *replayCache) add(jkt, jti string, now time.Time) bool {
	h := sha256.Sum256([]byte(jkt + "\x00" + jti))
	var k [16]byte
	copy(k[:], h[:16])
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.head < len(c.queue) && (!c.queue[c.head].expires.After(now) || len(c.seen) >= c.cap) {
		delete(c.seen, c.queue[c.head].key)
		c.head++
	}
	if c.head > len(c.queue)/2 && c.head > 1024 {
		c.queue = append(c.queue[:0:0], c.queue[c.head:]...)
		c.head = 0
	}
	if _, dup := c.seen[k]; dup {
		return false
	}
	c.seen[k] = struct{}{}
	c.queue = append(c.queue, replayEntry{key: k, expires: now.Add(c.ttl)})
	return true
}

func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	// crypto/rand.Read never fails (it panics on a broken system source).
	_, _ = rand.Read(b)
	return b
}
