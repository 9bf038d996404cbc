package alert

import (
	"sync"
	"time"
)

// Defaults for StormConfig.
const (
	DefaultStormThreshold = 100
	DefaultStormWindow    = time.Minute
)

// StormConfig tunes a StormDetector. The zero value works.
type StormConfig struct {
	// Threshold is how many refusals within one Window make a storm
	// (default 100).
	Threshold int
	// Window is the span refusals are counted over (default 1 min).
	Window time.Duration
	// OnStorm is called once when a storm starts, on the goroutine of the
	// Record that started it; it must not block (Webhook.Send does not).
	OnStorm func(Storm)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Storm describes a storm as it starts.
type Storm struct {
	Start time.Time `json:"start"`
	// Refusals is the count over the last Window when it started.
	Refusals      int   `json:"refusals"`
	Threshold     int   `json:"threshold"`
	WindowSeconds int64 `json:"windowSeconds"`
}

// StormDetector notices storms of refused requests (503s): Threshold or
// more within a sliding Window. It fires once per storm; a storm ends when
// a whole Window passes with fewer than Threshold. Safe for concurrent
// use and cheap enough for every refusal.
type StormDetector struct {
	cfg StormConfig

	mu      sync.Mutex
	start   time.Time // of the current fixed window
	cur     int       // refusals in the current fixed window
	prev    int       // refusals in the one before
	inStorm bool
	storms  int64
}

// NewStormDetector returns a detector for cfg.
func NewStormDetector(cfg StormConfig) *StormDetector {
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultStormThreshold
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultStormWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &StormDetector{cfg: cfg}
}

// Record counts one refusal and reports whether it started a storm (then
// OnStorm has been called).
func (d *StormDetector) Record() bool {
	now := d.cfg.Now()
	d.mu.Lock()
	d.roll(now)
	d.cur++
	// Sliding estimate: the previous window's count, weighted by how much
	// of it still lies within Window of now, plus the current one's.
	frac := float64(now.Sub(d.start)) / float64(d.cfg.Window)
	n := int(float64(d.prev)*(1-frac)) + d.cur
	if d.inStorm || n < d.cfg.Threshold {
		d.mu.Unlock()
		return false
	}
	d.inStorm = true
	d.storms++
	s := Storm{Start: now, Refusals: n, Threshold: d.cfg.Threshold, WindowSeconds: int64(d.cfg.Window / time.Second)}
	d.mu.Unlock()
	if d.cfg.OnStorm != nil {
		d.cfg.OnStorm(s)
	}
	return true
}

// Active says whether a storm is going on.
func (d *StormDetector) Active() bool {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.roll(now)
	return d.inStorm
}

// Storms counts the storms seen so far.
func (d *StormDetector) Storms() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.storms
}

// roll moves the fixed windows up to now, ending a storm after a window
// below Threshold. d.mu held.
func (d *StormDetector) roll(now time.Time) {
	if d.start.IsZero() {
		d.start = now
		return
	}
	n := now.Sub(d.start) / d.cfg.Window
	if n < 1 {
		return
	}
	done := d.cur
	if n > 1 {
		done = 0 // whole windows passed without a refusal
	}
	d.prev, d.cur = done, 0
	d.start = d.start.Add(n * d.cfg.Window)
	if done < d.cfg.Threshold {
		d.inStorm = false
	}
}
