package relaywatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// maxResponseBytes bounds what is read of a relay's answer: getHostStatus
// is a few short fields.
const maxResponseBytes = 16 << 10

// maxTextBytes bounds relay-supplied text kept or logged (error names,
// messages, status).
const maxTextBytes = 200

// maxHostnameBytes is the longest DNS name.
const maxHostnameBytes = 253

// Check results, the values of the checks counter's result label.
const (
	resultOK       = "ok"
	resultNotFound = "host_not_found"
	resultError    = "error"
	resultTimeout  = "timeout"
)

// observation is one relay's answer to getHostStatus.
type observation struct {
	result       string
	err          string
	status       string
	seq          int64
	hasSeq       bool
	accountCount *int64
}

// hostStatus is com.atproto.sync.getHostStatus#output.
type hostStatus struct {
	Hostname     string  `json:"hostname"`
	Seq          *int64  `json:"seq"`
	AccountCount *int64  `json:"accountCount"`
	Status       *string `json:"status"`
}

// xrpcError is the body of an XRPC error.
type xrpcError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// query asks the relay at base how far it has read us, bounded by Timeout
// and maxResponseBytes.
func (w *Watch) query(ctx context.Context, base string) observation {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	u := base + "/xrpc/com.atproto.sync.getHostStatus?" + url.Values{"hostname": {w.host}}.Encode()
	status, body, err := w.call(ctx, http.MethodGet, u, nil)
	if err != nil {
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return observation{result: resultTimeout, err: fmt.Sprintf("no answer within %s", w.cfg.Timeout)}
		}
		return observation{result: resultError, err: bounded(err.Error())}
	}
	if status != http.StatusOK {
		var xe xrpcError
		_ = json.Unmarshal(body, &xe)
		if xe.Error == "HostNotFound" {
			return observation{result: resultNotFound}
		}
		msg := fmt.Sprintf("getHostStatus answered %d", status)
		if xe.Error != "" {
			msg += " " + xe.Error
		}
		if xe.Message != "" {
			msg += ": " + xe.Message
		}
		return observation{result: resultError, err: bounded(msg)}
	}
	var hs hostStatus
	if err := json.Unmarshal(body, &hs); err != nil {
		return observation{result: resultError, err: bounded("getHostStatus answer is not the lexicon's JSON: " + err.Error())}
	}
	o := observation{result: resultOK, accountCount: hs.AccountCount}
	if hs.Seq != nil {
		o.seq, o.hasSeq = *hs.Seq, true
	}
	if hs.Status != nil {
		o.status = bounded(*hs.Status)
	}
	return o
}

// requestCrawl asks the relay at base to crawl us
// (com.atproto.sync.requestCrawl), bounded by Timeout.
func (w *Watch) requestCrawl(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	body, err := json.Marshal(map[string]string{"hostname": w.host})
	if err != nil {
		return err
	}
	status, resp, err := w.call(ctx, http.MethodPost, base+"/xrpc/com.atproto.sync.requestCrawl", body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("requestCrawl answered %d: %s", status, bounded(string(bytes.TrimSpace(resp))))
	}
	return nil
}

// call makes one request and reads at most maxResponseBytes of the answer.
func (w *Watch) call(ctx context.Context, method, u string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return 0, nil, err
	}
	if len(data) > maxResponseBytes {
		return 0, nil, fmt.Errorf("answer over %d bytes", maxResponseBytes)
	}
	return resp.StatusCode, data, nil
}

// bounded cuts relay-supplied text to maxTextBytes, on a rune boundary.
func bounded(s string) string {
	if len(s) <= maxTextBytes {
		return s
	}
	s = s[:maxTextBytes]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// normalizeHostname turns the --hostname setting into the form relays key
// hosts by: lower case, no scheme, a port only with it ("localhost:PORT").
func normalizeHostname(raw string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(raw))
	h = strings.TrimPrefix(strings.TrimPrefix(h, "https://"), "http://")
	h = strings.TrimSuffix(h, "/")
	if h == "" || len(h) > maxHostnameBytes {
		return "", fmt.Errorf("%w: %q", ErrInvalidHostname, raw)
	}
	u, err := url.Parse("http://" + h)
	if err != nil || u.Host != h || u.Hostname() == "" {
		return "", fmt.Errorf("%w: %q", ErrInvalidHostname, raw)
	}
	return h, nil
}

// parseRelay turns a relay's host name or base URL into its base URL and
// name (host[:port]). A bare name means https, except "localhost:PORT",
// which means http (as indigo reads requestCrawl's hostname).
func parseRelay(raw string) (base, name string, err error) {
	s := strings.TrimSpace(raw)
	if len(s) > 2*maxHostnameBytes {
		return "", "", fmt.Errorf("%w: too long", ErrInvalidRelay)
	}
	if !strings.Contains(s, "://") {
		if strings.HasPrefix(strings.ToLower(s), "localhost:") {
			s = "http://" + s
		} else {
			s = "https://" + s
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", "", fmt.Errorf("%w: %q", ErrInvalidRelay, raw)
	}
	switch u.Scheme = strings.ToLower(u.Scheme); u.Scheme {
	case "https", "http":
	case "wss":
		u.Scheme = "https"
	case "ws":
		u.Scheme = "http"
	default:
		return "", "", fmt.Errorf("%w: %q: scheme must be http or https", ErrInvalidRelay, raw)
	}
	name = strings.ToLower(u.Host)
	if u.Hostname() == "" || len(name) > maxHostnameBytes || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "" {
		return "", "", fmt.Errorf("%w: %q: want a host name or a base URL", ErrInvalidRelay, raw)
	}
	return u.Scheme + "://" + name, name, nil
}
