package pds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/gorilla/websocket"
)

// The bad-input sweep's client (badinput_test.go): it sends the cases and
// judges the answers.

// sweeper sends cases and collects what is wrong with the answers.
type sweeper struct {
	env    *accountEnv
	client *http.Client
	logs   *lockedBuffer
	seq    atomic.Int64
	count  atomic.Int64

	mu sync.Mutex
	// answers counts answers by method and "status name", for the log.
	answers map[string]map[string]int
}

func (sw *sweeper) note(nsid string, status int, b []byte) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.answers[nsid] == nil {
		sw.answers[nsid] = map[string]int{}
	}
	k := itoa(status)
	if status >= 400 {
		k += " " + errorName(b)
	}
	sw.answers[nsid][k]++
}

// send sends c to nsid with auth and returns a complaint, or "".
// unimplemented accepts 501 MethodNotImplemented, the answer of a method
// this server registers but does not implement, whatever the input.
func (sw *sweeper) send(nsid string, auth http.Header, c sweepCase, unimplemented bool) string {
	id := "badinput-" + itoa(int(sw.seq.Add(1)))
	sw.count.Add(1)
	u := sw.env.url + "/xrpc/" + nsid
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	}
	req, err := http.NewRequest(c.verb, u, body)
	if err != nil {
		return "building request: " + err.Error()
	}
	req.URL.RawQuery = c.query
	if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	for k, vs := range auth {
		req.Header[k] = vs
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	req.Header.Set("X-Request-Id", id)
	resp, err := sw.client.Do(req)
	if err != nil {
		return fmt.Sprintf("no answer (%v)%s", err, sw.logs.about(id))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("status %d, body cut off (%v)%s", resp.StatusCode, err, sw.logs.about(id))
	}
	sw.note(nsid, resp.StatusCode, b)
	return sw.judge(id, c, resp, b, unimplemented)
}

func (sw *sweeper) judge(id string, c sweepCase, resp *http.Response, b []byte, unimplemented bool) string {
	status := resp.StatusCode
	if unimplemented && status == http.StatusNotImplemented && errorName(b) == "MethodNotImplemented" {
		return ""
	}
	switch {
	case status >= 500:
		return fmt.Sprintf("status %d: %s%s", status, truncate(string(b), 300), sw.logs.about(id))
	case status < 200 || status >= 300 && status < 400:
		return fmt.Sprintf("unexpected status %d: %s", status, truncate(string(b), 300))
	case status < 400 || c.statusOnly:
		return ""
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Sprintf("status %d with Content-Type %q: %s", status, ct, truncate(string(b), 300))
	}
	var e struct {
		Error   *string `json:"error"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Sprintf("status %d, body not JSON (%v): %s", status, err, truncate(string(b), 300))
	}
	if e.Error == nil || *e.Error == "" || e.Message == nil || *e.Message == "" {
		return fmt.Sprintf("status %d without an error name and message: %s", status, truncate(string(b), 300))
	}
	return ""
}

func errorName(b []byte) string {
	var e xrpcErrorBody
	_ = json.Unmarshal(b, &e)
	return e.Error
}

// lockedBuffer is the server's log, kept to explain a failure.
type lockedBuffer struct{ syncbuf.Buffer }

// about returns the log lines of request id, if any.
func (l *lockedBuffer) about(id string) string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, "request_id="+id+" ") {
			out = append(out, truncate(strings.TrimSpace(line), 2000))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "\n\tserver log: " + strings.Join(out, "\n\tserver log: ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("…(%d bytes)", len(s))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// probeAnswer sends probe and returns the answer (status 0: none).
func probeAnswer(sw *sweeper, nsid string, auth http.Header, probe sweepCase) (int, http.Header, []byte) {
	var body io.Reader
	if probe.body != nil {
		body = bytes.NewReader(probe.body)
	}
	req, err := http.NewRequest(probe.verb, sw.env.url+"/xrpc/"+nsid, body)
	if err != nil {
		return 0, nil, nil
	}
	if probe.ctype != "" {
		req.Header.Set("Content-Type", probe.ctype)
	}
	for k, vs := range auth {
		req.Header[k] = vs
	}
	resp, err := sw.client.Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// subscribeCases are subscribeRepos' WebSocket handshakes: a bad cursor is
// refused before the upgrade, with the XRPC error shape, and a botched
// handshake gets an XRPC error too.
func subscribeCases(t *testing.T, sw *sweeper) []string {
	t.Helper()
	wsURL := "ws" + strings.TrimPrefix(sw.env.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	var problems []string
	for _, cursor := range []string{"-5", "abc", "1.5", "9223372036854775808", "%00", strings.Repeat("9", 3000)} {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL+"?cursor="+url.QueryEscape(cursor), nil)
		if err == nil {
			conn.Close()
			problems = append(problems, fmt.Sprintf("cursor=%s: upgraded", truncate(cursor, 20)))
			continue
		}
		if resp == nil {
			problems = append(problems, fmt.Sprintf("cursor=%s: no answer (%v)", truncate(cursor, 20), err))
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if what := sw.judge("", sweepCase{}, resp, b, false); what != "" {
			problems = append(problems, fmt.Sprintf("cursor=%s: %s", truncate(cursor, 20), what))
		} else if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusTooManyRequests {
			problems = append(problems, fmt.Sprintf("cursor=%s: status %d, want 400 (or 429)", truncate(cursor, 20), resp.StatusCode))
		}
	}
	// A future cursor and a valid one are accepted; the connection is
	// closed at once.
	for _, cursor := range []string{"0", "99999999999"} {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL+"?cursor="+cursor, nil)
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			if status != http.StatusTooManyRequests {
				problems = append(problems, fmt.Sprintf("cursor=%s: %v (status %d)", cursor, err, status))
			}
			continue
		}
		conn.Close()
	}
	// Half a WebSocket handshake: the upgrade headers without a key, or
	// with a version nobody speaks.
	for name, h := range map[string]http.Header{
		"no key":      {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}},
		"version 12":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"12"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"no version":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"bad cursor":  {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}},
		"upgrade h2c": {"Connection": {"Upgrade"}, "Upgrade": {"h2c"}},
	} {
		c := sweepCase{name: "handshake " + name, verb: http.MethodGet, header: h}
		if name == "bad cursor" {
			c.query = "cursor=-5"
		}
		if what := sw.send("com.atproto.sync.subscribeRepos", nil, c, false); what != "" {
			problems = append(problems, c.name+": "+what)
		}
	}
	return problems
}
