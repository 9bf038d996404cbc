package pds

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-pds/bulwark/budget"
)

// A proxied request's share of the in-flight byte budget.
//
// What a proxied request holds in memory is not the size of its answer: a
// relayed answer streams through one 32 KiB buffer whatever its size, so
// reserving the largest answer allowed (10 MiB) for every call would
// admit a few dozen app view calls at once and starve everything else of
// the budget. What grows with the answer is what the proxy holds back:
// read-after-write reads an answer whole before it rewrites it, and then
// decodes it into a tree. So each proxied request reserves a fixed
// proxyReserve when it is admitted (from its pool, then from the budget,
// first come, first served with getRepo exports and blob downloads; a
// full queue is a 503 before any upstream work; proxy_admission.go), and
// then, as it reads the upstream's body, the bytes it
// has read but not yet written to the client (held) are charged for what
// they will cost once decoded (heldCost), taken from the budget in pieces
// of at least proxyGrowStep. A relayed stream never holds more than one
// buffer, so it never grows; a buffered answer grows with its size, up to
// --proxy-max-response.
//
// Growth waits its turn in the budget's queue like any admission, so the
// memory of all requests stays within the budget however many buffer at
// once. A request that cannot get its next piece within proxyGrowWait
// (everyone admitted is holding and waiting) gives up with 503
// ServiceOverloaded and frees what it held, so the others go on: holding
// and waiting cannot deadlock the budget. Nothing has reached the client
// when that happens: held bytes are, by definition, not yet written. An
// answer whose cost is more than the app view's pool (half the budget)
// less this request's own fixed share can never be buffered; on the
// smallest budget (16 MiB) that is a timeline of about 350 KB, while the
// app view lags.
//
// Only the configured app view's answers are ever held back: an upstream
// an atproto-proxy header names is anyone's, and buffering and decoding
// what anyone sends (a small gzip that decodes to the limit, sent slowly)
// would be budget anyone could take. Their atproto-repo-rev is kept from
// the proxy, so it relays them as they come, and restored on the way out.
const (
	// proxyReserve is the heap one proxied request holds while it relays:
	// the copy buffer, the upstream connection's and the response's
	// buffers, the request state. 56-81 KB measured per request, 32
	// relaying 4 MiB each (BenchmarkProxyHeap).
	proxyReserve = 128 << 10
	// proxyDecodeFactor is the heap per byte of a held-back answer's
	// decoded form: the answer read whole, decoded to a tree, spliced and
	// encoded again. 10-20 measured for timelines of 64 KiB to 4 MiB, the
	// smaller the higher (BenchmarkProxyHeap).
	proxyDecodeFactor = 20
	// proxyCompressionRatio is how many decoded bytes a compressed byte
	// of the app view's answer is taken for (capped at
	// --proxy-max-response): app view JSON gzips 10-25 times.
	proxyCompressionRatio = 25
	// proxyGrowStep is the smallest piece a growing request takes from
	// the budget.
	proxyGrowStep = 1 << 20
	// proxyGrowWait bounds the wait for a piece.
	proxyGrowWait = 5 * time.Second
)

// heldCost is the heap an answer costs whose first held bytes are read
// and not yet written: those bytes, plus their decoded form at
// proxyDecodeFactor, plus the fixed share.
func heldCost(held int64, encoded bool, maxResponse int64) int64 {
	decoded := held
	if encoded {
		decoded = min(held*proxyCompressionRatio, maxResponse)
	}
	return proxyReserve + held + decoded*proxyDecodeFactor
}

// errProxyOverloaded is what the upstream body reader fails with when the
// budget had no room for what the request holds.
var errProxyOverloaded = errors.New("in-flight budget has no room for the proxied answer")

// proxyFlow is one proxied request's reservations and byte counts.
type proxyFlow struct {
	// budgets are what it reserves from, in order: its pools, then the
	// in-flight budget (proxyAdmission.budgets; none: no limit).
	budgets     []*budget.Budget
	ctx         context.Context
	maxResponse int64
	// upstreamRev is the atproto-repo-rev of an answer kept from the proxy
	// (budgetTransport), to be restored for the client.
	upstreamRev string
	read        atomic.Int64 // upstream body bytes read
	written     atomic.Int64 // response body bytes written to the client

	mu       sync.Mutex
	held     []*budget.Reservation
	reserved int64
	// refused is the budget's refusal, set when growth failed.
	refused error
}

// startProxyFlow admits a proxied request with its fixed reservation
// from each of budgets in turn.
func (s *Server) startProxyFlow(ctx context.Context, budgets []*budget.Budget) (*proxyFlow, error) {
	f := &proxyFlow{budgets: budgets, ctx: ctx, maxResponse: s.cfg.ProxyMaxResponse}
	res, err := f.acquire(ctx, proxyReserve)
	if err != nil {
		return nil, err
	}
	f.held, f.reserved = res, proxyReserve
	return f, nil
}

// acquire reserves n bytes from every budget of the flow, in order; on
// failure it gives back what it took.
func (f *proxyFlow) acquire(ctx context.Context, n int64) ([]*budget.Reservation, error) {
	out := make([]*budget.Reservation, 0, len(f.budgets))
	for _, b := range f.budgets {
		res, err := b.Acquire(ctx, n)
		if err != nil {
			for _, r := range out {
				r.Release()
			}
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// release gives back everything the request holds.
func (f *proxyFlow) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.held {
		r.Release()
	}
	f.held, f.reserved = nil, 0
}

// overloaded returns the budget's refusal if growth failed.
func (f *proxyFlow) overloaded() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// cover makes the reservation cover what the request holds now: the
// bytes read from the upstream and not yet written to the client.
func (f *proxyFlow) cover(encoded bool) error {
	held := max(f.read.Load()-f.written.Load(), 0)
	need := heldCost(held, encoded, f.maxResponse)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused != nil {
		return f.refused
	}
	if len(f.budgets) == 0 || need <= f.reserved {
		return nil
	}
	step := max(need-f.reserved, proxyGrowStep)
	ctx, cancel := context.WithTimeout(f.ctx, proxyGrowWait)
	defer cancel()
	// Waiting under f.mu is fine: only this request's own goroutine reads
	// its upstream body.
	res, err := f.acquire(ctx, step)
	if err != nil {
		if f.ctx.Err() != nil {
			return err // the client went away; nothing to report
		}
		if !errors.Is(err, budget.ErrOverloaded) {
			err = &budget.OverloadedError{RetryAfter: budget.DefaultRetryAfter}
		}
		f.refused = err
		return errProxyOverloaded
	}
	f.held = append(f.held, res...)
	f.reserved += step
	return nil
}

type proxyFlowKey struct{}

func withProxyFlow(ctx context.Context, f *proxyFlow) context.Context {
	return context.WithValue(ctx, proxyFlowKey{}, f)
}

// budgetTransport counts, for the request's proxyFlow, the upstream body
// bytes read, and grows the reservation before each read. It keeps the
// atproto-repo-rev of answers from anywhere but trusted (the configured
// app view's origin) from the proxy, so that it never holds them back.
type budgetTransport struct {
	base    http.RoundTripper
	trusted string
}

func (t budgetTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	f, ok := req.Context().Value(proxyFlowKey{}).(*proxyFlow)
	if !ok {
		return resp, nil
	}
	if rev := resp.Header.Get("Atproto-Repo-Rev"); rev != "" && req.URL.Scheme+"://"+req.URL.Host != t.trusted {
		f.upstreamRev = rev
		resp.Header.Del("Atproto-Repo-Rev")
	}
	enc := resp.Header.Get("Content-Encoding")
	resp.Body = &flowBody{ReadCloser: resp.Body, flow: f, encoded: enc != "" && enc != "identity"}
	return resp, nil
}

type flowBody struct {
	io.ReadCloser
	flow    *proxyFlow
	encoded bool
}

func (b *flowBody) Read(p []byte) (int, error) {
	if err := b.flow.cover(b.encoded); err != nil {
		return 0, err
	}
	n, err := b.ReadCloser.Read(p)
	b.flow.read.Add(int64(n))
	return n, err
}

// proxyWriter is the response writer of a proxied request: a streamWriter
// (each write pushes the write deadline forward, so a client that stops
// reading is dropped) that counts what reached the client.
type proxyWriter struct {
	*streamWriter
	flow *proxyFlow
}

// WriteHeader restores an atproto-repo-rev budgetTransport kept from the
// proxy.
func (w *proxyWriter) WriteHeader(code int) {
	if rev := w.flow.upstreamRev; rev != "" && w.Header().Get("Atproto-Repo-Rev") == "" {
		w.Header().Set("Atproto-Repo-Rev", rev)
	}
	w.streamWriter.WriteHeader(code)
}

func (w *proxyWriter) Write(p []byte) (int, error) {
	n, err := w.streamWriter.Write(p)
	w.flow.written.Add(int64(n))
	return n, err
}
