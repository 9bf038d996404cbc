package main

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
	"sync/atomic"
	"time"
)

// client is an XRPC client of one base URL (the balancer or a node).
type client struct {
	base string
	http *http.Client
}

func newClient(base string, timeout time.Duration) *client {
	return &client{base: base, http: &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// xrpcError is an answer other than 200.
type xrpcError struct {
	Status int
	Name   string `json:"error"`
	Msg    string `json:"message"`
}

func (e *xrpcError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Name, e.Msg) }

// call makes an XRPC call: a JSON body for a procedure (body not nil) or
// a query, decoding a 200 answer into out.
func (c *client) call(ctx context.Context, method, nsid, token string, q url.Values, body, out any) error {
	u := c.base + "/xrpc/" + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	ct := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ct = bytes.NewReader(b), "application/octet-stream"
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd, ct = bytes.NewReader(raw), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		e := &xrpcError{Status: resp.StatusCode}
		_ = json.Unmarshal(raw, e)
		return e
	}
	if out == nil {
		return nil
	}
	if b, ok := out.(*[]byte); ok {
		*b = raw
		return nil
	}
	return json.Unmarshal(raw, out)
}

// account is a test account and its session.
type account struct {
	did, handle, password, token string
}

// createAccount signs an account up (open sign-up on a local host name).
func (c *client) createAccount(ctx context.Context, handle string) (*account, error) {
	a := &account{handle: handle, password: "cluster-test-password-" + handle}
	var out struct {
		DID       string `json:"did"`
		AccessJwt string `json:"accessJwt"`
	}
	err := c.call(ctx, http.MethodPost, "com.atproto.server.createAccount", "", nil,
		map[string]string{"handle": handle, "email": handle + "@example.com", "password": a.password}, &out)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", handle, err)
	}
	a.did, a.token = out.DID, out.AccessJwt
	return a, nil
}

// ack is a write the server acknowledged.
type ack struct {
	did, path, cid, rev string
}

// ackLog collects acknowledged writes and counts the failures.
type ackLog struct {
	mu     sync.Mutex
	acks   []ack
	errors map[string]int
}

func newAckLog() *ackLog { return &ackLog{errors: map[string]int{}} }

func (l *ackLog) add(a ack) {
	l.mu.Lock()
	l.acks = append(l.acks, a)
	l.mu.Unlock()
}

func (l *ackLog) fail(err error) {
	key := "transport error"
	if xe, ok := err.(*xrpcError); ok {
		key = fmt.Sprintf("%d %s", xe.Status, xe.Name)
		if strings.Contains(xe.Msg, "already exists") {
			key = fmt.Sprintf("%d record already exists", xe.Status)
		}
	}
	l.mu.Lock()
	l.errors[key]++
	l.mu.Unlock()
}

func (l *ackLog) snapshot() ([]ack, map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := make(map[string]int, len(l.errors))
	for k, v := range l.errors {
		errs[k] = v
	}
	return append([]ack(nil), l.acks...), errs
}

// createPost writes one post without a record key; an acknowledged one is
// logged.
func (c *client) createPost(ctx context.Context, a *account, text string, log *ackLog) error {
	var out struct {
		URI    string `json:"uri"`
		CID    string `json:"cid"`
		Commit struct {
			Rev string `json:"rev"`
		} `json:"commit"`
	}
	rec := map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": time.Now().UTC().Format(time.RFC3339Nano)}
	err := c.call(ctx, http.MethodPost, "com.atproto.repo.createRecord", a.token, nil,
		map[string]any{"repo": a.did, "collection": "app.bsky.feed.post", "record": rec}, &out)
	if err != nil {
		if ctx.Err() == nil {
			// Not a write the run stopped waiting for.
			log.fail(err)
		}
		return err
	}
	path := strings.TrimPrefix(out.URI, "at://"+a.did+"/")
	log.add(ack{did: a.did, path: path, cid: out.CID, rev: out.Commit.Rev})
	return nil
}

// writers runs one writer per (client, account) pair until ctx ends or
// total writes are acknowledged (0: until ctx ends); a failed write is
// retried with a fresh one after a pause. It returns how long it ran.
func writers(ctx context.Context, clients []*client, accounts []*account, total int, log *ackLog) time.Duration {
	start := time.Now()
	var done atomic.Int64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range clients {
		a := accounts[i%len(accounts)]
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				if total > 0 && done.Load() >= int64(total) {
					cancel()
					return
				}
				if err := c.createPost(ctx, a, fmt.Sprintf("writer %d post %d", i, n), log); err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// probe writes one post a tick straight to a node, for the time each
// takes to appear on the firehoses.
type probe struct {
	mu    sync.Mutex
	did   string
	acked map[string]time.Time // rev -> acknowledged at
}

func (p *probe) run(ctx context.Context, c *client, a *account, tick time.Duration, log *ackLog) {
	p.mu.Lock()
	p.did, p.acked = a.did, map[string]time.Time{}
	p.mu.Unlock()
	t := time.NewTicker(tick)
	defer t.Stop()
	for n := 0; ; n++ {
		var out struct {
			Commit struct {
				Rev string `json:"rev"`
			} `json:"commit"`
			URI string `json:"uri"`
			CID string `json:"cid"`
		}
		rec := map[string]any{"$type": "app.bsky.feed.post", "text": fmt.Sprint("probe ", n), "createdAt": time.Now().UTC().Format(time.RFC3339Nano)}
		err := c.call(ctx, http.MethodPost, "com.atproto.repo.createRecord", a.token, nil,
			map[string]any{"repo": a.did, "collection": "app.bsky.feed.post", "record": rec}, &out)
		if err == nil {
			p.mu.Lock()
			p.acked[out.Commit.Rev] = time.Now()
			p.mu.Unlock()
			log.add(ack{did: a.did, path: strings.TrimPrefix(out.URI, "at://"+a.did+"/"), cid: out.CID, rev: out.Commit.Rev})
		} else if ctx.Err() == nil {
			log.fail(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ackTimes are the probe's acknowledged revs and when, and its account.
func (p *probe) ackTimes() (string, map[string]time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(p.acked))
	for k, v := range p.acked {
		out[k] = v
	}
	return p.did, out
}
