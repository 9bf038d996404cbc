package pds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// writeError answers err as an XRPC error. A 500 is logged with its cause
// and the request id, since the client only sees a generic message. If the
// handler already started its response, the error can only be logged.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	xe := xrpcErrorFor(err)
	status := xe.Status
	if xe.Name == "ServiceOverloaded" && s.onOverload != nil {
		s.onOverload()
	}
	logger := func() *slog.Logger {
		return s.logger.With("request_id", RequestID(r.Context()), "path", clip(r.URL.Path, maxLoggedPath))
	}
	// A 503 is a refusal under load, like a 429: logging each at error
	// level would add a synchronous write per refused request exactly when
	// the server is busiest. The metrics count them. A 501 answers a method
	// this server does not implement: nothing failed.
	if xe.Status >= 500 && xe.Status != http.StatusServiceUnavailable && xe.Status != http.StatusNotImplemented {
		if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
			// The client went away; nobody is waiting for the answer.
			if s.logger.Enabled(r.Context(), slog.LevelDebug) {
				logger().Debug("request canceled", "error", err)
			}
			status = statusClientClosed
		} else {
			logger().Error("request failed", "status", xe.Status, "error", err)
		}
	} else if s.logger.Enabled(r.Context(), slog.LevelDebug) {
		logger().Debug("request refused", "status", xe.Status, "error", xe.Name, "message", clip(xe.Message, maxLoggedMessage))
	}
	if rec, ok := w.(*responseRecorder); ok && rec.wroteHeader {
		logger().Warn("error after the response started; cannot report it to the client", "error", err)
		return
	}
	// The error's headers replace any set earlier (a limit that allowed
	// the request set its RateLimit-* headers before another refused it).
	for k, vs := range xe.Header {
		w.Header().Del(k)
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	_ = writeJSON(w, status, xrpcErrorBody{Error: xe.Name, Message: xe.Message})
}

// writeJSON answers v as JSON with status. It marshals before writing, so a
// value that cannot be encoded becomes a returned error (and then a 500)
// rather than half a response.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return nil
}

// decodeJSON reads a JSON procedure body into dst. Bad input is an
// InvalidRequest saying what is wrong (where the syntax breaks, which field
// has the wrong type); a body over the limit is a PayloadTooLarge. Unknown
// fields are accepted: lexicons grow, and clients send fields newer than
// this server.
func decodeJSON(r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return InvalidRequest("request body must be application/json, not %q", clip(ct, maxQuoted))
		}
	}
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return InvalidRequest("request body holds more than one JSON value")
	default:
		return jsonError(err)
	}
}

func jsonError(err error) error {
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return PayloadTooLarge("request body is larger than %d bytes", tooLarge.Limit)
	case errors.Is(err, io.EOF):
		return InvalidRequest("request body is empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return InvalidRequest("request body is truncated JSON")
	case errors.As(err, &syntaxErr):
		return InvalidRequest("malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return InvalidRequest("field %q: want %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return InvalidRequest("want a JSON %s, got %s", typeErr.Type, typeErr.Value)
	default:
		return InvalidRequest("invalid JSON body: %v", err)
	}
}

// params reads query parameters, remembering the first problem so that a
// handler reads all of them and checks once:
//
//	p := queryParams(r)
//	did := p.required("did")
//	limit := p.intParam("limit", 50, 1, 100)
//	if err := p.Err(); err != nil {
//		return err
//	}
type params struct {
	v   url.Values
	err error
}

func queryParams(r *http.Request) *params {
	return &params{v: r.URL.Query()}
}

// Err returns an InvalidRequest naming the first bad parameter, or nil.
func (p *params) Err() error { return p.err }

func (p *params) fail(format string, args ...any) {
	if p.err == nil {
		p.err = InvalidRequest(format, args...)
	}
}

// optional returns the parameter or "".
func (p *params) optional(name string) string { return p.text(name, p.v.Get(name)) }

// required returns the parameter, recording an error when it is missing or
// empty.
func (p *params) required(name string) string {
	v := p.text(name, p.v.Get(name))
	if v == "" {
		p.fail("missing required parameter %q", name)
	}
	return v
}

// list returns every value of a repeated parameter (?cids=a&cids=b).
func (p *params) list(name string) []string {
	vs := p.v[name]
	for _, v := range vs {
		p.text(name, v)
	}
	return vs
}

// text returns v, or records an error and returns "" when v is not text
// (invalid UTF-8, or a NUL byte): no parameter means either, and Postgres
// refuses both in a text column, which would make a cursor or a filter a
// 500 instead of the client's mistake.
func (p *params) text(name, v string) string {
	if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		p.fail("parameter %q must be UTF-8 text without NUL bytes", name)
		return ""
	}
	return v
}

// intParam returns an integer parameter within [lo, hi], or def when it is
// absent. Out of range is an error rather than clamped, as in the reference
// server, so that a client learns its limit is not honoured.
func (p *params) intParam(name string, def, lo, hi int64) int64 {
	raw := p.v.Get(name)
	if raw == "" {
		return def
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		p.fail("parameter %q must be an integer, not %q", name, raw)
		return def
	}
	if n < lo || n > hi {
		p.fail("parameter %q must be between %d and %d, not %d", name, lo, hi, n)
		return def
	}
	return n
}

// boolParam returns a boolean parameter ("true"/"false"), or def.
func (p *params) boolParam(name string, def bool) bool {
	switch raw := p.v.Get(name); raw {
	case "":
		return def
	case "true":
		return true
	case "false":
		return false
	default:
		p.fail("parameter %q must be true or false, not %q", name, raw)
		return def
	}
}

// did returns a required DID parameter, parsed.
func (p *params) did(name string) syntax.DID {
	raw := p.required(name)
	if raw == "" {
		return ""
	}
	d, err := syntax.ParseDID(raw)
	if err != nil {
		p.fail("parameter %q: %v", name, err)
	}
	return d
}

// methodKind says which HTTP verbs an XRPC method answers.
type methodKind int

const (
	// kindQuery is a read: GET, and HEAD which runs exactly the GET path
	// (net/http discards the body).
	kindQuery methodKind = iota
	// kindProcedure is a write: POST.
	kindProcedure
)

// handlerFunc is an XRPC handler. It writes its own success response
// (usually with writeJSON) and returns an error otherwise, which the router
// maps to an XRPC error through xrpcErrorFor.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// method is one registered XRPC method.
type method struct {
	nsid        string
	kind        methodKind
	handler     handlerFunc
	maxBody     int64
	longRunning bool
	// hashesPassword: the method hashes a password, for which its client
	// waits in the hash queue (account.WithClient).
	hashesPassword bool
	// bodyRate, when set, replaces the server's rule for this method's
	// body (a long-running procedure's).
	bodyRate *bodyRate
}

// methodOption adjusts a method at registration.
type methodOption func(*method)

// withMaxBody sets the method's body limit (default: the configured
// MaxJSONBody), e.g. for uploadBlob or importRepo.
func withMaxBody(n int64) methodOption {
	return func(m *method) { m.maxBody = n }
}

// longRunning lifts the server's read and write deadlines for the method.
// The http.Server's WriteTimeout counts from the end of the request headers
// and would cut off a streaming response (subscribeRepos, a large getRepo,
// a blob) part-way; such handlers must set their own per-write deadlines
// instead (gorilla/websocket's SetWriteDeadline, or a ResponseController
// before each chunk), so that a client that stops reading is still dropped.
func longRunning() methodOption {
	return func(m *method) { m.longRunning = true }
}

// withBodyRate holds a long-running procedure's body to rule instead of
// the server's minimum rate.
func withBodyRate(rule bodyRate) methodOption {
	return func(m *method) { m.bodyRate = &rule }
}

// query registers an XRPC query (GET/HEAD). It panics on a duplicate or a
// malformed name: both are programming errors found at start-up.
func (s *Server) query(nsid string, h handlerFunc, opts ...methodOption) {
	s.register(nsid, kindQuery, h, opts)
}

// hashesPassword marks a method that hashes a password (a login, a new
// account or password): its checks wait for a hash slot as its client's,
// so that one address holds at most its share of the hash queue.
func hashesPassword() methodOption {
	return func(m *method) { m.hashesPassword = true }
}

// procedure registers an XRPC procedure (POST).
func (s *Server) procedure(nsid string, h handlerFunc, opts ...methodOption) {
	s.register(nsid, kindProcedure, h, opts)
}

func (s *Server) register(nsid string, kind methodKind, h handlerFunc, opts []methodOption) {
	if _, err := syntax.ParseNSID(nsid); err != nil && !strings.HasPrefix(nsid, "_") {
		panic(fmt.Sprintf("pds: register %q: %v", nsid, err))
	}
	if _, dup := s.methods[nsid]; dup {
		panic(fmt.Sprintf("pds: %q registered twice", nsid))
	}
	m := &method{nsid: nsid, kind: kind, handler: h, maxBody: s.cfg.MaxJSONBody}
	for _, o := range opts {
		o(m)
	}
	s.methods[nsid] = m
}

// serveXRPC routes /xrpc/<nsid> to its method.
func (s *Server) serveXRPC(w http.ResponseWriter, r *http.Request) {
	nsid := strings.TrimPrefix(r.URL.Path, "/xrpc/")
	m, ok := s.methods[nsid]
	if !ok {
		// Proxied or refused as not implemented: under the global limit
		// either way, charged here once.
		err := s.rateLimit(w, ratelimit.PolicyGlobal, s.ipKey(r), 1)
		if err == nil {
			err = s.unknownMethod(w, r)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
		return
	}
	switch {
	case m.kind == kindQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead):
	case m.kind == kindProcedure && r.Method == http.MethodPost:
		if r.ContentLength > m.maxBody {
			// Refuse on the declared length before reading a byte.
			s.writeError(w, r, PayloadTooLarge("request body is %d bytes; the limit for %s is %d", r.ContentLength, nsid, m.maxBody))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, m.maxBody)
	case m.kind == kindQuery:
		s.writeError(w, r, MethodNotAllowed("GET, HEAD", "%s is a query: use GET", nsid))
		return
	default:
		s.writeError(w, r, MethodNotAllowed("POST", "%s is a procedure: use POST", nsid))
		return
	}
	// Before the body is read or any work is done: a refusal is cheap.
	if err := s.globalLimit(w, r, m); err != nil {
		s.writeError(w, r, err)
		return
	}
	if m.hashesPassword {
		r = r.WithContext(account.WithClient(r.Context(), s.ipKey(r)))
	}
	var body *rateReader
	if m.longRunning {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Time{}); err != nil {
			s.logger.Debug("cannot clear write deadline", "error", err)
		}
		if err := rc.SetReadDeadline(time.Time{}); err != nil {
			s.logger.Debug("cannot clear read deadline", "error", err)
		}
		if m.kind == kindProcedure {
			// Its body is no longer under ReadTimeout: hold it to a rate.
			rule := s.bodyRate
			if m.bodyRate != nil {
				rule = *m.bodyRate
			}
			body = newRateReader(w, r.Body, rule)
			r.Body = readCloser{body, r.Body}
		}
	}
	if err := m.handler(w, r); err != nil {
		if body != nil && !body.ended() {
			// A refused body need not arrive: net/http would read up to
			// 256 KiB more of it before answering, waiting on a client
			// that may send nothing (its read deadline is lifted). Closing
			// the connection after the answer skips that.
			w.Header().Set("Connection", "close")
		}
		s.writeError(w, r, err)
	}
}

// readCloser is a request body read through a wrapper and closed as the
// original.
type readCloser struct {
	io.Reader
	io.Closer
}

// methodNotImplemented answers any /xrpc/ path with no registered method.
// It is the default of Server.unknownMethod; the app-view proxy replaces it.
func methodNotImplemented(_ http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(r.URL.Path, "/xrpc/")
	if len(name) > 128 {
		name = name[:128] + "…"
	}
	return MethodNotImplemented("method %q is not implemented by this server", name)
}
