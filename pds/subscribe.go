package pds

import (
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// subscribeUpgrader upgrades admitted subscribeRepos requests. A botched
// handshake (no Sec-WebSocket-Key, another protocol version) is answered
// in the XRPC error shape like any other refusal, not with the upgrader's
// plain-text one.
var subscribeUpgrader = func() *websocket.Upgrader {
	u := firehose.Upgrader()
	u.Error = func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
		e := InvalidRequest("%v", reason)
		if status >= 500 {
			e = InternalServerError()
		}
		w.Header().Set("Sec-Websocket-Version", "13")
		_ = writeJSON(w, status, xrpcErrorBody{Error: e.Name, Message: e.Message})
	}
	return u
}()

// subscribeReposPath is the method's path; refusals on it are not
// access-logged one by one (see observe).
const subscribeReposPath = "/xrpc/com.atproto.sync.subscribeRepos"

// refusalLogInterval is how often refused subscriptions are summarised in
// the log.
const refusalLogInterval = time.Minute

// refusalLog counts refused subscriptions between summary log lines, so a
// flood costs one line a minute, not one per refusal.
type refusalLog struct {
	count atomic.Int64
	last  atomic.Int64 // unix nanoseconds of the last summary
}

func (l *refusalLog) note(logger *slog.Logger, client netip.Addr, err error, now time.Time) {
	n := l.count.Add(1)
	last := l.last.Load()
	if now.UnixNano()-last < int64(refusalLogInterval) || !l.last.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	l.count.Add(-n)
	attrs := []any{"refused", n, "latest_client", client.String(), "latest_reason", err.Error()}
	if last != 0 {
		attrs = append(attrs, "since", time.Unix(0, last).UTC())
	}
	logger.Warn("refusing subscribeRepos connections", attrs...)
}

// handleSubscribeRepos serves com.atproto.sync.subscribeRepos. Admission
// comes first, before the upgrade and before any database work: relays
// redial in a tight loop, so a refusal must cost next to nothing.
func (s *Server) handleSubscribeRepos(w http.ResponseWriter, r *http.Request) error {
	now := time.Now()
	client := s.clientIP(r)
	ticket, retry, err := s.subscribeAdmission.Admit(client, now)
	if err != nil {
		return s.refuseSubscription(r, client, retry, err, now)
	}
	defer ticket.Release()

	var cursor *int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil || c < 0 {
			return InvalidRequest("cursor must be a non-negative integer")
		}
		cursor = &c
	}
	if !websocket.IsWebSocketUpgrade(r) {
		return InvalidRequest("com.atproto.sync.subscribeRepos is a WebSocket endpoint")
	}
	conn, err := subscribeUpgrader.Upgrade(w, r, nil)
	if err != nil {
		// The upgrader has answered the client already.
		s.logger.Debug("subscribeRepos upgrade failed", "err", err)
		return nil
	}
	err = s.firehose.Serve(r.Context(), conn, cursor, firehose.Client{IP: client.String(), UserAgent: userAgent(r)})
	if err != nil && !firehose.IsClientGone(err) {
		s.logger.Warn("subscribeRepos ended on an error", "request_id", RequestID(r.Context()),
			"client", s.clientIP(r).String(), "err", err)
	}
	return nil
}

// refuseSubscription answers an upgrade admission refused. Refused
// upgrades count against the client's subscribeRefused limit (per
// address): within it the refusal is noted in the summary log and in
// consumer health, by address only; past it the client gets that limit's
// 429 and nothing is recorded, so that a flood of refusals costs a fixed
// amount whatever it sends.
func (s *Server) refuseSubscription(r *http.Request, client netip.Addr, retry time.Duration, err error, now time.Time) error {
	if l := s.protect.limits.Get(ratelimit.PolicySubscribeRefused); l != nil {
		if d := l.AllowN(ratelimit.IPKey(client), 1); !d.Allowed {
			return rateLimitError(ratelimit.PolicySubscribeRefused, d, now)
		}
	}
	s.subscribeRefusals.note(s.logger, client, err, now)
	s.firehose.Refused(client.String())
	return RateLimitExceeded(retry, "%s", err.Error())
}

// newSubscribeAdmission builds the subscribeRepos admission controller
// from the configuration, for opts.Firehose.
func newSubscribeAdmission(opts Options) *firehose.Admission {
	cfg := firehose.AdmissionConfig{
		Rate:           opts.Config.FirehoseRate.Limit(),
		Burst:          opts.Config.FirehoseBurst,
		Allow:          opts.Config.FirehoseAllow,
		MaxSubscribers: opts.Config.FirehoseMaxSubscribers,
		MaxPerClient:   opts.Config.FirehoseMaxPerClient,
	}
	if opts.FirehoseAdmission != nil {
		cfg = *opts.FirehoseAdmission
	}
	a := firehose.NewAdmission(cfg)
	if h := opts.Firehose.Health(); h != nil {
		// A repair lets the consumers stuck on the event straight back in.
		h.UseAdmission(a)
	}
	return a
}
