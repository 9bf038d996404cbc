package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-pds/bulwark/audit"
)

// Admin requestCrawl: ask relays to crawl this server now, as the reference
// PDS's `pdsadmin request-crawl` does. The server sends the call, so its own
// host name and configured crawlers are what count, wherever the admin runs
// the CLI.

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
	client := &http.Client{Timeout: requestCrawlTimeout}
	var wg sync.WaitGroup
	for i, relay := range relays {
		wg.Go(func() {
			results[i] = requestCrawlResult{Relay: relay, OK: true}
			if err := requestCrawl(r.Context(), client, relay, s.cfg.Hostname); err != nil {
				results[i].OK, results[i].Error = false, err.Error()
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
