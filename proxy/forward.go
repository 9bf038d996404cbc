package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Header allow-lists (the reference PDS's). Everything else, hop-by-hop
// headers and the client's own Authorization and cookies included, stays
// behind.
var (
	forwardedRequestHeaders = []string{"Accept-Language", "Atproto-Accept-Labelers", "X-Bsky-Topics"}
	// forwardedBodyHeaders go with a POST body (Content-Length is the
	// request's own).
	forwardedBodyHeaders  = []string{"Content-Type", "Content-Encoding"}
	passedResponseHeaders = []string{
		"Content-Length", "Content-Encoding", "Content-Type", "Content-Language",
		"Atproto-Repo-Rev", "Atproto-Content-Labelers", "Retry-After",
	}
)

const (
	// maxForwardedHeader bounds each forwarded request header's value.
	maxForwardedHeader = 8 << 10
	// copyBufferSize is the one buffer each relayed response uses.
	copyBufferSize = 32 << 10
	// maxErrorBody bounds what is read of an upstream 5xx body.
	maxErrorBody = 4 << 10
)

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// blobMethods take a raw upload as their body.
var blobMethods = map[syntax.NSID]bool{
	"com.atproto.repo.uploadBlob": true,
	"com.atproto.repo.importRepo": true,
	"app.bsky.video.uploadVideo":  true,
}

// IsBlobMethod reports whether nsid uploads raw bytes, so that its body
// gets Config.MaxBlobRequestBytes instead of MaxRequestBytes.
func IsBlobMethod(nsid syntax.NSID) bool { return blobMethods[nsid] }

// errTimeout is the cancel cause when the watchdog fires; the exchange's
// bound says which limit it was.
var errTimeout = errors.New("upstream timeout")

// bound is the limit the watchdog is armed for.
type bound int32

const (
	boundHeaders bound = iota // HeaderTimeout, for the response headers
	boundStall                // BodyTimeout, for the next bytes of the body
	boundTotal                // TotalTimeout, for the whole answer
	boundRate                 // MinRate, for the body's average rate
)

// exchange is one upstream round trip.
type exchange struct {
	p      *Proxy
	nsid   syntax.NSID
	label  string
	client context.Context // the client's request context
	ctx    context.Context
	cancel context.CancelCauseFunc
	// timer is the watchdog: armed once the request is sent for the
	// response headers, then around each read of the response body for
	// the nearest of BodyTimeout, the answer's TotalTimeout and the time
	// its MinRate says the next byte is due; armed says which.
	timer *time.Timer
	armed atomic.Int32 // a bound
	// mu orders the request body's arming of the header watchdog with
	// the arrival of the response headers, after which only the handler
	// goroutine touches the timer.
	mu        sync.Mutex
	done      bool      // the round trip is over (headers in, or failed)
	headersIn bool      // the response headers are in
	sent      time.Time // when the request was all sent: the answer's clock
	headersAt time.Time // when the response headers came in
	reqBody   *requestBody
	status    int   // status written to the client
	respBytes int64 // response body bytes read
	aborted   *Error
}

// Forward sends r to t and relays the answer to w. It refuses methods
// other than GET, HEAD and POST and applies Check itself, so a refused
// request costs no upstream call. An authenticated caller's request
// carries a fresh service token; the client's own credentials never leave.
//
// Forward returns an error (an *Error) only when nothing was written to w:
// the caller answers it. 2xx and 4xx answers are relayed as they are
// (status, allowed headers, body); 3xx and 500 become ErrUpstreamFailure,
// other 5xx ErrUpstreamStatus with the upstream's status, name and
// message (checkStatus). The answer must be complete within TotalTimeout
// of the request being sent, and arrive at MinRate.
// Once the response has started, a failure (the upstream stalls past
// BodyTimeout, the body grows past MaxResponseBytes, the client goes away)
// cannot be reported any more, so Forward aborts the response with
// panic(http.ErrAbortHandler): the client sees a broken transfer, never a
// truncated body that looks whole. Middleware that recovers panics must
// re-panic http.ErrAbortHandler.
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, nsid syntax.NSID, t Target, c Caller) (err error) {
	start := time.Now()
	ex := &exchange{p: p, nsid: nsid, label: p.label(t), client: r.Context()}
	defer func() { ex.observe(start, err) }()
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return newError(ErrBadRequest, nil, "only GET, HEAD and POST requests can be proxied")
	}
	if err := Check(nsid, c); err != nil {
		return err
	}
	if t.URL == "" {
		return newError(ErrNotConfigured, nil, "no service configured for %s", nsid)
	}
	if aud := string(t.DID) + "#" + t.ServiceID; c.Permits != nil && !c.Permits(string(nsid), aud) {
		return newError(ErrNotPermitted, nil, "this app's access to the account does not include %s at %s: it needs the permission rpc:%s?aud=%s", nsid, aud, nsid, aud)
	}
	authz, err := p.authorization(r.Context(), r, nsid, t, c)
	if err != nil {
		return err
	}
	req, err := ex.newRequest(r, t, authz, p.rawEligible(r, nsid, c))
	if err != nil {
		return err
	}
	defer ex.cancel(nil)
	defer ex.timer.Stop()
	resp, err := p.client.Do(req)
	ex.roundTripDone(err == nil)
	if err != nil {
		return ex.failure(err)
	}
	defer resp.Body.Close()
	if err := ex.checkStatus(resp); err != nil {
		return err
	}
	if r.Method != http.MethodHead && resp.ContentLength > p.cfg.MaxResponseBytes {
		return ex.tooLarge()
	}
	if p.rawEligible(r, nsid, c) {
		switch {
		case resp.StatusCode == http.StatusOK:
			if st, behind := p.behind(r.Context(), resp, c.DID, nsid, false); behind {
				return ex.readAfterWrite(w, r, resp, c, st)
			}
		case resp.StatusCode == http.StatusBadRequest && nsid == getPostThreadNSID:
			if st, behind := p.behind(r.Context(), resp, c.DID, nsid, t.URL == p.cfg.AppViewURL); behind {
				return ex.threadNotFound(w, r, resp, c, st)
			}
		}
	}
	return ex.relay(w, r, resp)
}

// newRequest builds the upstream request: the allowed headers, the token,
// the body within its limit, and a context that ends with the client's.
func (ex *exchange) newRequest(r *http.Request, t Target, authz string, raw bool) (*http.Request, error) {
	p := ex.p
	hdr := make(http.Header, 8)
	for _, name := range forwardedRequestHeaders {
		if err := copyRequestHeader(hdr, r.Header, name); err != nil {
			return nil, err
		}
	}
	hdr.Set("Accept-Encoding", acceptEncoding(r.Header.Values("Accept-Encoding"), raw))
	hdr.Set("User-Agent", p.cfg.UserAgent)
	if authz != "" {
		hdr.Set("Authorization", authz)
	}
	var body io.Reader
	if r.Method == http.MethodPost {
		limit := p.cfg.MaxRequestBytes
		if IsBlobMethod(ex.nsid) {
			limit = p.cfg.MaxBlobRequestBytes
		}
		if r.ContentLength > limit {
			return nil, newError(ErrRequestTooLarge, nil, "request body is larger than %d bytes", limit)
		}
		for _, name := range forwardedBodyHeaders {
			if err := copyRequestHeader(hdr, r.Header, name); err != nil {
				return nil, err
			}
		}
		if r.ContentLength != 0 && r.Body != nil {
			ex.reqBody = &requestBody{r: r.Body, limit: limit, ex: ex}
			body = ex.reqBody
		}
	}
	ex.ctx, ex.cancel = context.WithCancelCause(r.Context())
	ex.timer = time.AfterFunc(time.Hour, func() { ex.cancel(errTimeout) })
	ex.timer.Stop()
	if body == nil {
		ex.armHeaderTimer()
	} // else armed once the body is sent (requestBody)
	u := t.URL + "/xrpc/" + string(ex.nsid)
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(ex.ctx, r.Method, u, body)
	if err != nil {
		ex.timer.Stop()
		ex.cancel(nil)
		return nil, newError(ErrBadRequest, err, "cannot build the upstream request")
	}
	req.Header = hdr
	if body != nil && r.ContentLength > 0 {
		req.ContentLength = r.ContentLength
	}
	return req, nil
}

func copyRequestHeader(dst, src http.Header, name string) error {
	vals := src.Values(name)
	if len(vals) == 0 {
		return nil
	}
	v := strings.Join(vals, ", ")
	if len(v) > maxForwardedHeader {
		return newError(ErrBadRequest, nil, "header %s is longer than %d bytes", name, maxForwardedHeader)
	}
	dst.Set(name, v)
	return nil
}

// acceptEncoding is what the upstream may compress with: the client's
// choice (identity when it states none, as the reference PDS does), or,
// when the answer may have to be read for read-after-write, gzip or
// identity only, which this package can decode.
func acceptEncoding(vals []string, raw bool) string {
	v := strings.Join(vals, ", ")
	if v == "" || len(v) > maxForwardedHeader {
		return "identity"
	}
	if raw {
		if acceptsGzip(v) {
			return "gzip"
		}
		return "identity"
	}
	return v
}

func acceptsGzip(v string) bool {
	for _, part := range strings.Split(v, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(name), "gzip") {
			continue
		}
		q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}

// requestBody bounds the forwarded request body and arms the header
// watchdog once it has all been sent.
type requestBody struct {
	r        io.Reader
	limit    int64
	ex       *exchange
	n        atomic.Int64
	tooLarge atomic.Bool
}

func (b *requestBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.n.Add(int64(n)) > b.limit {
		b.tooLarge.Store(true)
		return 0, ErrRequestTooLarge
	}
	if err == io.EOF {
		b.ex.armHeaderTimer()
	}
	return n, err
}

// armHeaderTimer starts the answer's clock and the wait for response
// headers once the request is sent, unless they are in already.
func (ex *exchange) armHeaderTimer() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.done {
		return
	}
	ex.sent = time.Now()
	d, b := ex.p.cfg.HeaderTimeout, boundHeaders
	if ex.p.cfg.TotalTimeout < d {
		d, b = ex.p.cfg.TotalTimeout, boundTotal
	}
	ex.armed.Store(int32(b))
	ex.timer.Reset(d)
}

func (ex *exchange) roundTripDone(headersIn bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.done, ex.headersIn = true, headersIn
	ex.headersAt = time.Now()
	if ex.sent.IsZero() {
		ex.sent = ex.headersAt // answered before the body was all sent
	}
	ex.timer.Stop()
}

func (ex *exchange) gotHeaders() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.headersIn
}

// checkStatus turns upstream answers that must not reach the client as
// they are into errors: redirects (never followed), 500 (UpstreamFailure)
// and other server errors (passed on as their status, name and message,
// ErrUpstreamStatus). 2xx and 4xx answers are relayed as they are.
func (ex *exchange) checkStatus(resp *http.Response) error {
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300, s >= 400 && s < 500:
		return nil
	case s >= 300 && s < 400:
		ex.log(slog.LevelWarn, "upstream redirect refused", "status", s)
		return newError(ErrUpstreamFailure, nil, "upstream service answered with a redirect (%d), which is not followed", s)
	case s == http.StatusInternalServerError:
		// The one status the reference PDS maps: an upstream's internal
		// error is not this server's.
		name, msg := ex.upstreamError(resp)
		ex.log(slog.LevelWarn, "upstream failure", "status", s, "upstream_error", name)
		if name != "" {
			return newError(ErrUpstreamFailure, nil, "upstream service failed (%d %s): %s", s, name, msg)
		}
		return newError(ErrUpstreamFailure, nil, "upstream service failed (%d)", s)
	case s > 500 && s < 600:
		name, msg := ex.upstreamError(resp)
		ex.log(slog.LevelWarn, "upstream error passed on", "status", s, "upstream_error", name)
		return upstreamStatusError(s, name, msg)
	default:
		return newError(ErrUpstreamFailure, nil, "upstream service answered with status %d", s)
	}
}

// relay streams resp to w through one fixed buffer. The status line is
// committed only once the first bytes (or the end) of the body are in, so
// an upstream that stalls before its body still gets a proper 504.
func (ex *exchange) relay(w http.ResponseWriter, r *http.Request, resp *http.Response) error {
	if r.Method == http.MethodHead {
		ex.writeHeader(w, resp)
		return nil
	}
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	buf := *bufp
	limit := ex.p.cfg.MaxResponseBytes
	n, err := ex.read(resp.Body, buf)
	if err != nil && err != io.EOF {
		return ex.failure(err)
	}
	if int64(n) > limit {
		return ex.tooLarge()
	}
	ex.writeHeader(w, resp)
	rc := http.NewResponseController(w)
	var total int64
	for {
		if total += int64(n); total > limit {
			ex.abort(ex.tooLarge())
		}
		if n > 0 {
			// Flushed at once: what the upstream sent, the client gets,
			// however long the upstream then takes for the rest.
			_, werr := w.Write(buf[:n])
			if werr == nil {
				if ferr := rc.Flush(); !errors.Is(ferr, http.ErrNotSupported) {
					werr = ferr
				}
			}
			if werr != nil {
				ex.abort(newError(ErrCanceled, werr, "client went away"))
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			ex.abort(ex.failure(err))
		}
		n, err = ex.read(resp.Body, buf)
	}
}

// upstreamError reads the XRPC error name and message of a failed
// upstream answer, if its first few kilobytes hold one.
func (ex *exchange) upstreamError(resp *http.Response) (name, msg string) {
	buf := make([]byte, maxErrorBody)
	n := 0
	for n < len(buf) {
		m, err := ex.read(resp.Body, buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	return errorBody(buf[:n], resp.Header.Get("Content-Encoding"))
}

// errorBody reads the XRPC error name and message of raw, an error
// answer's body in encoding, decoding at most maxErrorBody bytes.
func errorBody(raw []byte, encoding string) (name, msg string) {
	if encoding == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return "", ""
		}
		// A short body is all there is: what decodes is used.
		raw, _ = io.ReadAll(io.LimitReader(zr, maxErrorBody))
	}
	var body struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &body) != nil {
		return "", ""
	}
	return printable(body.Error, 64), printable(body.Message, 256)
}

// printable makes an upstream's string safe to pass on: valid UTF-8, no
// control characters, at most max bytes.
func printable(s string, max int) string {
	s = strings.ToValidUTF8(s, "")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "")
	}
	return s
}

func (ex *exchange) writeHeader(w http.ResponseWriter, resp *http.Response) {
	h := w.Header()
	for _, name := range passedResponseHeaders {
		if vals := resp.Header.Values(name); len(vals) > 0 {
			h[name] = append([]string(nil), vals...)
		}
	}
	ex.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
}

// read reads once from the upstream body under the body watchdog.
func (ex *exchange) read(body io.Reader, buf []byte) (int, error) {
	if !ex.armBodyTimer() {
		return 0, errTimeout
	}
	n, err := body.Read(buf)
	ex.timer.Stop()
	ex.respBytes += int64(n)
	return n, err
}

// armBodyTimer arms the watchdog for the next read of the body: for
// BodyTimeout, or less when the answer's total time or its minimum rate
// runs out first. When one has run out already it ends the exchange and
// reports false. Called on the handler goroutine once the headers are in.
func (ex *exchange) armBodyTimer() bool {
	cfg := &ex.p.cfg
	now := time.Now()
	d, b := cfg.BodyTimeout, boundStall
	if left := ex.sent.Add(cfg.TotalTimeout).Sub(now); left < d {
		d, b = left, boundTotal
	}
	// The next byte is due when the bytes so far, one more, would make
	// the average since MinRateAfter exactly MinRate.
	due := ex.headersAt.Add(cfg.MinRateAfter + time.Duration(float64(ex.respBytes+1)*float64(time.Second)/float64(cfg.MinRate)))
	if left := due.Sub(now); left < d {
		d, b = left, boundRate
	}
	ex.armed.Store(int32(b))
	if d <= 0 {
		ex.cancel(errTimeout)
		return false
	}
	ex.timer.Reset(d)
	return true
}

// failure classifies an error from the upstream exchange.
func (ex *exchange) failure(err error) *Error {
	switch {
	case ex.reqBody != nil && ex.reqBody.tooLarge.Load():
		return newError(ErrRequestTooLarge, nil, "request body is larger than %d bytes", ex.reqBody.limit)
	case context.Cause(ex.ctx) == errTimeout:
		return ex.timedOut(err)
	case ex.client.Err() != nil:
		return newError(ErrCanceled, err, "client went away")
	case ex.gotHeaders():
		ex.log(slog.LevelWarn, "upstream broke off its answer", "error", err)
		return newError(ErrUpstreamFailure, err, "upstream service broke off its answer")
	default:
		ex.log(slog.LevelWarn, "upstream unreachable", "error", err)
		return newError(ErrUpstreamFailure, err, "upstream service unreachable")
	}
}

// timedOut is the error of an exchange the watchdog ended.
func (ex *exchange) timedOut(err error) *Error {
	cfg := &ex.p.cfg
	ex.log(slog.LevelWarn, "upstream timeout", "error", err, "bound", bound(ex.armed.Load()), "bytes", ex.respBytes)
	switch {
	case bound(ex.armed.Load()) == boundTotal:
		return newError(ErrUpstreamTimeout, err, "upstream service did not finish its answer within %s", cfg.TotalTimeout)
	case bound(ex.armed.Load()) == boundRate:
		return newError(ErrUpstreamTimeout, err, "upstream service sent its answer slower than %d bytes a second", cfg.MinRate)
	case ex.status != 0 || ex.respBytes > 0:
		return newError(ErrUpstreamTimeout, err, "upstream service stalled for %s while sending its answer", cfg.BodyTimeout)
	case ex.gotHeaders():
		return newError(ErrUpstreamTimeout, err, "upstream service sent no body within %s", cfg.BodyTimeout)
	default:
		return newError(ErrUpstreamTimeout, err, "upstream service did not answer within %s", cfg.HeaderTimeout)
	}
}

func (b bound) String() string {
	switch b {
	case boundHeaders:
		return "headers"
	case boundStall:
		return "stall"
	case boundTotal:
		return "total"
	default:
		return "rate"
	}
}

func (ex *exchange) tooLarge() *Error {
	ex.log(slog.LevelWarn, "upstream response too large", "limit", ex.p.cfg.MaxResponseBytes)
	return newError(ErrResponseTooLarge, nil, "upstream response is larger than %d bytes", ex.p.cfg.MaxResponseBytes)
}

// abort ends a response that has started: see Forward.
func (ex *exchange) abort(err *Error) {
	ex.aborted = err
	panic(http.ErrAbortHandler)
}

func (ex *exchange) observe(start time.Time, err error) {
	status := ex.status
	var pe *Error
	switch {
	case ex.aborted != nil:
		status = ex.aborted.Status
	case errors.As(err, &pe):
		status = pe.Status
	case status == 0:
		status = http.StatusInternalServerError
	}
	var reqBytes int64
	if ex.reqBody != nil {
		reqBytes = ex.reqBody.n.Load()
	}
	ex.p.metrics.observe(ex.label, status, time.Since(start), reqBytes, ex.respBytes)
}

func (ex *exchange) log(level slog.Level, msg string, args ...any) {
	ex.p.logger.Log(ex.client, level, msg, append([]any{"nsid", ex.nsid, "service", ex.label}, args...)...)
}
