package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/outbound"
)

// Admin requestCrawl: ask relays to crawl this server now, as the reference
// PDS's `pdsadmin request-crawl` does. The server sends the call, so its own
// host name and configured crawlers are what count, wherever the admin runs
// the CLI.
//
// Every call goes through the SSRF-safe outbound client, as every request
// to a URL someone supplies does, even the admin: a configured crawler
// (--crawlers) may be on a private address when the setting names it as
// an IP address or localhost (as for the relay watch); a relay named in
// the request only when --proxy-allow-private allows its address.

// Limits of requestCrawl.
const (
	// maxRelayURLLen bounds a relay URL given by the admin.
	maxRelayURLLen = 512
	// requestCrawlTimeout bounds one relay's answer; relays are asked at
	// once, so the method answers within it, inside WriteTimeout.
	requestCrawlTimeout = 20 * time.Second
)

// requestCrawlInput is the method's body; an empty relay means every
// configured crawler (--crawlers).
type requestCrawlInput struct {
	Relay string `json:"relay,omitempty"`
}

// requestCrawlResult is one relay's outcome.
type requestCrawlResult struct {
	Relay string `json:"relay"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func (s *Server) registerAdminCrawlRoutes() {
	s.procedure(AdminNSIDPrefix+"requestCrawl", s.admin(s.handleRequestCrawl))
}

func (s *Server) handleRequestCrawl(w http.ResponseWriter, r *http.Request) error {
	var in requestCrawlInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	relays := s.cfg.Crawlers
	if in.Relay != "" {
		u, err := relayURL(in.Relay)
		if err != nil {
			return err
		}
		relays = []string{u}
	}
	if len(relays) == 0 {
		return InvalidRequest("no relay given and no crawlers configured (--crawlers, BULWARK_CRAWLERS)")
	}
	results := make([]requestCrawlResult, len(relays))
	var wg sync.WaitGroup
	for i, relay := range relays {
		wg.Go(func() {
			results[i] = requestCrawlResult{Relay: relay, OK: true}
			if err := requestCrawl(r.Context(), s.crawlClient(relay), relay, s.cfg.Hostname); err != nil {
				results[i].OK, results[i].Error = false, crawlError(err)
			}
		})
	}
	wg.Wait()
	for _, res := range results {
		s.logger.Info("admin requestCrawl", "relay", res.Relay, "ok", res.OK, "error", res.Error, "request_id", RequestID(r.Context()))
	}
	e := &audit.Entry{Actor: adminActor, Action: AdminNSIDPrefix + "requestCrawl", Subject: s.cfg.Hostname, After: map[string]any{"results": results}}
	if err := audit.Record(r.Context(), s.db, e); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]any{"hostname": s.cfg.Hostname, "results": results})
}

// crawlClient is the client that asks relay: the configured crawlers'
// (which may reach the private addresses they name literally) for one of
// them, the server's outbound client for any other.
func (s *Server) crawlClient(relay string) *http.Client {
	for _, c := range s.cfg.Crawlers {
		if u, err := relayURL(c); err == nil && u == relay {
			return s.crawlers.HTTPClient()
		}
	}
	return s.outbound.HTTPClient()
}

// newCrawlersClient is the client for the configured crawlers.
func newCrawlersClient(cfg *config.Config, logger *slog.Logger) *outbound.Client {
	allow := append(outbound.LiteralHosts(cfg.Crawlers), cfg.ProxyAllowPrivate...)
	return outbound.New(outbound.Config{AllowCIDRs: allow, Timeout: requestCrawlTimeout, MaxResponseBytes: 64 << 10, Logger: logger})
}

// crawlError is the error reported for a relay: a refusal of the outbound
// guard says what to do about it.
func crawlError(err error) string {
	if outbound.Refused(err) {
		return err.Error() + " (a relay on a private address must be in --crawlers as an IP address, or in --proxy-allow-private)"
	}
	return err.Error()
}

// relayURL checks a relay given by the admin: an http(s) base URL, or a bare
// host name (https is assumed, as pdsadmin does).
func relayURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if len(raw) > maxRelayURLLen {
		return "", InvalidRequest("relay is longer than %d bytes", maxRelayURLLen)
	}
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", InvalidRequest("relay %q is not an http(s) base URL like https://bsky.network", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// requestCrawl asks one relay to crawl hostname
// (com.atproto.sync.requestCrawl).
func requestCrawl(ctx context.Context, client *http.Client, relay, hostname string) error {
	body, err := json.Marshal(map[string]string{"hostname": hostname})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, relay+"/xrpc/com.atproto.sync.requestCrawl", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
