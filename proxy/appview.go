package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// appViewCall asks the configured app view one method on behalf of the
// caller and returns its JSON answer.
type appViewCall func(nsid syntax.NSID, q url.Values) (map[string]any, error)

// appViewCaller returns lookups on the configured app view for c (nil
// without an app view), and the function that ends them. They are bound
// to ctx (the request's: its budget accounting and its end apply) and
// together to HeaderTimeout: however many one answer makes, a slow app
// view holds it that long at most. Each answer is bounded to limit bytes.
func (p *Proxy) appViewCaller(ctx context.Context, c Caller, limit int64) (appViewCall, context.CancelFunc) {
	if p.cfg.AppViewURL == "" {
		return nil, func() {}
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HeaderTimeout)
	return func(nsid syntax.NSID, q url.Values) (map[string]any, error) {
		return p.callAppView(ctx, c, nsid, q, limit)
	}, cancel
}

// callAppView GETs nsid with q from the configured app view, with a
// service token for c when c is signed in, within ctx and limit bytes,
// through the proxy's client (guarded, no redirects).
func (p *Proxy) callAppView(ctx context.Context, c Caller, nsid syntax.NSID, q url.Values, limit int64) (map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.AppViewURL+"/xrpc/"+string(nsid)+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", p.cfg.UserAgent)
	req.Header.Set("Accept-Encoding", "identity")
	if c.Authenticated && c.DID != "" && p.cfg.Keys != nil {
		tok, err := p.mint(ctx, c.DID, p.cfg.AppViewDID, nsid)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("app view answered %s with %d", nsid, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("app view's %s answer is larger than %d bytes", nsid, limit)
	}
	return decodeObject(body)
}
