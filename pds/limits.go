package pds

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/priority"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// Protecting the server: the rate limits (429) and the in-flight byte
// budget (503) as the handlers use them. Each handler calls one helper from
// here before its expensive part, so that a refusal costs no database work.

// Reservations against the in-flight byte budget: the peak heap each kind
// of response holds, measured with budget.MeasureHeap by
// BenchmarkReservationHeap (docs/BENCHMARKS.md, "Reservations measured"),
// rounded up.
const (
	// getRepoReserve is one streamed CAR export. It does not grow with the
	// repository: what stays live is the 64 KiB write buffer, pgx's read
	// buffer and one row; the rest (about 1.2 bytes allocated per byte
	// sent) is garbage the collector reclaims as the stream goes. Eight
	// concurrent exports of a 19 MiB repository peaked at 16 MiB of heap
	// in all (BenchmarkGetRepo), 2 MiB each.
	getRepoReserve = 2 << 20
	// blobReserve is one streamed blob: 66 KiB measured (ServeContent's
	// copy buffer and the store's reader) whatever the blob's size. A
	// blob is never read into memory whole.
	blobReserve = 128 << 10
	// proofReserve is a sync.getRecord proof CAR, built in memory: 127-130
	// KiB measured for ordinary records (the commit, one MST node per
	// level, the record, and the transaction's buffers). The record's own
	// bytes are reserved on top, proofRecordFactor times.
	proofReserve = 256 << 10
	// proofRecordFactor is a proof's heap per byte of its record: the row
	// read, the copy in the CAR being built, and the CAR written out.
	proofRecordFactor = 3
	// blockReserve is what getBlocks reserves per CID asked for, before
	// knowing the blocks' sizes: MST nodes and records are mostly well
	// under a KiB. Once the sizes are known the reservation is what the
	// stream holds: its buffer and the largest block, blockFactor times.
	blockReserve = 8 << 10
	// blockFactor is getBlocks' heap per byte of the block in hand: the
	// row pgx read and the copy scanned out of it (the CAR is streamed,
	// not built).
	blockFactor = 4
	// recordDecodeFactor is the heap a record's JSON rendering holds per
	// byte of its CBOR: read, decoded to a map, encoded as JSON (8.4-8.8
	// measured on 100 KiB and 900 KiB records).
	recordDecodeFactor = 10
	// largeRecord is the size from which repo.getRecord reserves: smaller
	// records cost less than the reservation's bookkeeping is worth.
	largeRecord = 64 << 10
)

// statusClientClosed is the status recorded (access log, metrics) for a
// request whose client went away before the answer, nginx's 499: counted
// as a 500 it would look like a server fault, and under load (clients
// giving up in a queue) there are many.
const statusClientClosed = 499

// exportQueuePerSlot is how many getRepo exports may wait per export slot.
const exportQueuePerSlot = 8

// Policy names as the handlers use them (ratelimit.Policy*), so that a
// handler file needs no import for its one-line limit.
const (
	policyCreateAccount = ratelimit.PolicyCreateAccount
	policyDeleteAccount = ratelimit.PolicyDeleteAccount
	policyResetPassword = ratelimit.PolicyResetPassword
	policyUpdateHandle  = ratelimit.PolicyUpdateHandle
	policyUploadBlob    = ratelimit.PolicyUploadBlob
)

// ServiceOverloaded is the 503 for work refused because the server is
// saturated: the in-flight byte budget's wait queue is full. It carries
// Retry-After. Clients should back off, not retry at once.
func ServiceOverloaded(retryAfter time.Duration, format string, args ...any) *XRPCError {
	e := newError(http.StatusServiceUnavailable, "ServiceOverloaded", format, args...)
	e.Header = http.Header{ratelimit.HeaderRetryAfter: {strconv.FormatInt(ratelimit.RetryAfterSeconds(retryAfter), 10)}}
	return e
}

// protection is the Server's share of the limits: nil fields are off.
type protection struct {
	// budget bounds the bytes of expensive responses in flight.
	budget *budget.Budget
	// exports bounds concurrent getRepo exports, one unit per export: each
	// holds a Postgres connection (one snapshot) for as long as the client
	// reads, so scrapers must not be able to take the whole pool.
	exports *budget.Budget
	// cachedExports bounds concurrent getRepo answers served from the CAR
	// cache (no database connection, but CPU and bandwidth).
	cachedExports *budget.Budget
	// limits are the rate limiters by policy name.
	limits *ratelimit.Set
}

// newProtection builds the protection of opts. The export slots default
// to a quarter of the pool: writes and ordinary reads keep the rest.
func newProtection(opts Options) protection {
	p := protection{budget: opts.Budget, limits: opts.Limits}
	slots := opts.ExportSlots
	if slots == 0 && opts.DB != nil {
		slots = max(1, int(opts.DB.Config().MaxConns)/4)
	}
	if slots > 0 {
		// An export lasts seconds (a 100,000-record repository is ~25 MB),
		// so a long queue would hold clients for minutes until they time
		// out: allow a few exports' worth of waiters per slot and refuse
		// the rest at once. --inflight-queue still caps it (0 = no waiting,
		// which is -1 for budget.Config).
		queue := exportQueuePerSlot * slots
		if opts.Config != nil {
			queue = min(queue, opts.Config.InflightQueue)
		}
		if queue == 0 {
			queue = -1
		}
		p.exports = budget.New(budget.Config{Capacity: int64(slots), MaxQueue: queue})
		p.cachedExports = budget.New(budget.Config{Capacity: int64(cachedExportsPerSlot * slots), MaxQueue: queue})
	}
	return p
}

// cachedExportsPerSlot is how many getRepo answers from the CAR cache may
// stream at once per database export slot: they hold no connection, and
// each is paced (--export-rate).
const cachedExportsPerSlot = 4

// rateLimit spends points of policy's limiter for key. Allowed, it reports
// the limit in the RateLimit-* headers; refused, it returns 429
// RateLimitExceeded with those headers and Retry-After. A policy that is
// off (or a server without limits) allows everything.
func (s *Server) rateLimit(w http.ResponseWriter, policy, key string, points int) error {
	return s.rateLimitHeader(w.Header(), policy, key, points)
}

// rateLimitHeader is rateLimit for callers that hold only the response's
// header (or none worth sending: a fresh one).
func (s *Server) rateLimitHeader(h http.Header, policy, key string, points int) error {
	l := s.protect.limits.Get(policy)
	if l == nil {
		return nil
	}
	d := l.AllowN(key, points)
	now := time.Now()
	if d.Allowed {
		ratelimit.SetHeaders(h, d, now)
		return nil
	}
	// The global limit's headers may already be set; the refusing limit's
	// replace them rather than adding second values.
	for _, k := range []string{ratelimit.HeaderLimit, ratelimit.HeaderRemaining, ratelimit.HeaderReset, ratelimit.HeaderPolicy, ratelimit.HeaderRetryAfter} {
		h.Del(k)
	}
	return rateLimitError(policy, d, now)
}

// rateLimitError is the 429 of a refused decision of policy, carrying the
// RateLimit-* headers and Retry-After.
func rateLimitError(policy string, d ratelimit.Decision, now time.Time) *XRPCError {
	e := newError(http.StatusTooManyRequests, "RateLimitExceeded", "rate limit exceeded (%s, %d per %s); retry in %s",
		policy, d.Rule.Limit, d.Rule.Window, d.RetryAfter.Round(time.Second))
	e.Header = ratelimit.Headers(d, now)
	return e
}

// ipKey is the rate-limit key of the request's client address.
func (s *Server) ipKey(r *http.Request) string {
	return ratelimit.IPKey(s.clientIP(r))
}

// limitIP applies policy keyed by the client's address (createAccount,
// deleteAccount, resetPassword).
func (s *Server) limitIP(w http.ResponseWriter, r *http.Request, policy string) error {
	return s.rateLimit(w, policy, s.ipKey(r), 1)
}

// limitDID applies policy keyed by the calling account (uploadBlob,
// updateHandle).
func (s *Server) limitDID(w http.ResponseWriter, policy string, did syntax.DID) error {
	return s.rateLimit(w, policy, did.String(), 1)
}

// globalLimit is the per-address limit every XRPC method is under, checked
// by serveXRPC before the body is read. subscribeRepos has its own
// admission instead (firehose.Admission: a bucket per address, then the
// subscribeRefused limit), and the unlimitedMethods say why they have
// none.
func (s *Server) globalLimit(w http.ResponseWriter, r *http.Request, m *method) error {
	policy := ratelimit.PolicyGlobal
	switch m.nsid {
	case "com.atproto.sync.subscribeRepos":
		return nil
	case "com.atproto.sync.getRepo":
		policy = ratelimit.PolicyGetRepo
	}
	if _, ok := unlimitedMethods[m.nsid]; ok {
		return nil
	}
	return s.rateLimit(w, policy, s.ipKey(r), 1)
}

// writePoints is what writes cost against the per-account write limit.
func writePoints(writes []repo.Write) int {
	n := 0
	for _, w := range writes {
		switch w.Action {
		case repo.ActionCreate:
			n += ratelimit.WriteCostCreate
		case repo.ActionUpdate:
			n += ratelimit.WriteCostUpdate
		default:
			n += ratelimit.WriteCostDelete
		}
	}
	return n
}

// reserve takes n bytes from the in-flight budget, waiting its turn; it
// fails at once with ServiceOverloaded when the wait queue is full. Call
// it before the work, and defer the release.
func (s *Server) reserve(ctx context.Context, n int64) (*budget.Reservation, error) {
	if s.protect.budget == nil {
		return nil, nil // a nil *Reservation is valid and holds nothing
	}
	return s.protect.budget.Acquire(ctx, n)
}

// reserveMore makes res (an estimate reserved before the work) hold at
// least n bytes once the real cost is known. A larger need is not added
// to what res holds, which could wait forever while holding bytes others
// wait for: res is given back and n is queued for like any request. The
// returned reservation replaces res (and is nil, holding nothing, on
// error).
func (s *Server) reserveMore(ctx context.Context, res *budget.Reservation, n int64) (*budget.Reservation, error) {
	if s.protect.budget == nil || n <= res.Size() {
		return res, nil
	}
	res.Release()
	return s.reserve(ctx, n)
}

// guard is reserve for a fixed cost, returning just the release.
func (s *Server) guard(ctx context.Context, n int64) (release func(), err error) {
	return budget.Guard(ctx, s.protect.budget, n)
}

// guardExport admits one getRepo export: an export slot (a Postgres
// connection for the length of the stream), then its bytes.
func (s *Server) guardExport(ctx context.Context) (release func(), err error) {
	slot, err := budget.Guard(ctx, s.protect.exports, 1)
	if err != nil {
		return nil, err
	}
	bytes, err := s.guard(ctx, getRepoReserve)
	if err != nil {
		slot()
		return nil, err
	}
	return func() { bytes(); slot() }, nil
}

// guardRecord reserves the heap of rendering a record of size bytes as
// JSON, when it is large enough to matter.
func (s *Server) guardRecord(ctx context.Context, size int) (release func(), err error) {
	if size < largeRecord {
		return func() {}, nil
	}
	return s.guard(ctx, int64(size)*recordDecodeFactor)
}

// observeRequest records a finished request in the metrics. The method
// label is the NSID only for registered methods: anything else is chosen
// by the client. Streams (subscribeRepos, CAR exports, blobs) are counted
// but kept out of the latency histogram, where their minutes-long
// durations would drown the figures of ordinary requests.
func (s *Server) observeRequest(r *http.Request, status int, hijacked bool, elapsed time.Duration) {
	nsid, ok := strings.CutPrefix(r.URL.Path, "/xrpc/")
	m := s.methods[nsid]
	if !ok || m == nil {
		metrics.ObserveRequest("", status, elapsed)
		return
	}
	if hijacked || (m.longRunning && status < 400) {
		metrics.CountRequest(nsid, status)
		return
	}
	metrics.ObserveRequest(nsid, status, elapsed)
}

// ExportSlots returns the budget that bounds concurrent getRepo exports
// (one unit per export), for metrics; nil when unbounded.
func (s *Server) ExportSlots() *budget.Budget { return s.protect.exports }

func observeBackgroundPause(d time.Duration, timedOut bool) {
	metrics.BackgroundPauses.Inc()
	metrics.BackgroundPauseSeconds.Add(d.Seconds())
	if timedOut {
		metrics.BackgroundPauseTimeouts.Inc()
	}
}

// newPriorityGate is the gate of opts: Options.Priority as given, or a new
// one pausing at most Options.BackgroundMaxPause (zero: the configured
// --background-max-pause, whose zero is never).
func newPriorityGate(opts Options) *priority.Gate {
	if opts.Priority != nil {
		return opts.Priority
	}
	pause := opts.BackgroundMaxPause
	if pause == 0 && opts.Config != nil {
		pause = opts.Config.BackgroundMaxPause
	}
	if pause == 0 {
		pause = -1 // priority.Config's "never"
	}
	return priority.New(priority.Config{MaxPause: pause, OnPause: observeBackgroundPause})
}
