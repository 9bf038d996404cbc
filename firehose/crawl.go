package firehose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultCrawlInterval is the least time between two requestCrawl calls to
// one relay, as the reference PDS does.
const DefaultCrawlInterval = 20 * time.Minute

// CrawlConfig tunes a CrawlNotifier.
type CrawlConfig struct {
	// Hostname is this server's public host name, sent to the relays.
	Hostname string
	// Crawlers are the relays' base URLs (https://relay.example).
	Crawlers []string
	// Interval is the least time between calls to one relay (default
	// DefaultCrawlInterval).
	Interval time.Duration
	// Client makes the calls (default: a client with a 30s timeout).
	Client *http.Client
	// Logger receives failed calls (default slog.Default()).
	Logger *slog.Logger
	// Now tells the time the intervals are measured in (default time.Now).
	Now func() time.Time
}

// CrawlNotifier asks relays to crawl this server after writes
// (com.atproto.sync.requestCrawl), at most once per Interval per relay.
// Notify never blocks: the calls happen on Run's goroutine.
type CrawlNotifier struct {
	cfg  CrawlConfig
	log  *slog.Logger
	wake chan struct{}

	mu   sync.Mutex
	last map[string]time.Time
}

// NewCrawlNotifier returns a notifier for cfg.
func NewCrawlNotifier(cfg CrawlConfig) *CrawlNotifier {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultCrawlInterval
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &CrawlNotifier{
		cfg:  cfg,
		log:  cfg.Logger.With("component", "crawl-notifier"),
		wake: make(chan struct{}, 1),
		last: map[string]time.Time{},
	}
}

// Notify records that something was written. Register it with
// Sequencer.OnSequenced (the seq is ignored).
func (c *CrawlNotifier) Notify(int64) {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run calls the relays after each Notify that falls outside a relay's
// interval, until ctx ends. A write inside the interval is not carried
// over: the relay is subscribed by then and sees it on the stream.
func (c *CrawlNotifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		}
		now := c.cfg.Now()
		for _, u := range c.cfg.Crawlers {
			c.mu.Lock()
			due := now.Sub(c.last[u]) >= c.cfg.Interval
			if due {
				c.last[u] = now
			}
			c.mu.Unlock()
			if !due {
				continue
			}
			if err := c.requestCrawl(ctx, u); err != nil && ctx.Err() == nil {
				c.log.Warn("requestCrawl failed", "relay", u, "err", err)
			}
		}
	}
}

func (c *CrawlNotifier) requestCrawl(ctx context.Context, base string) error {
	body, _ := json.Marshal(map[string]string{"hostname": c.cfg.Hostname})
	url := strings.TrimSuffix(base, "/") + "/xrpc/com.atproto.sync.requestCrawl"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	c.log.Info("requested crawl", "relay", base)
	return nil
}
