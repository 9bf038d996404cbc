// Package metrics is Bulwark's Prometheus instrumentation: the collectors,
// one registry, and the private listener that serves /metrics and pprof.
//
// The registry is this package's own, not prometheus.DefaultRegisterer:
// indigo registers its metrics globally, and Bulwark's names must neither
// clash with nor be polluted by whatever a dependency registers.
//
// Counters and gauges that code updates as things happen (requests,
// commits, frames) are package variables, so any package can record
// without plumbing. State that already lives elsewhere (the byte budget,
// the rate limiters, the Postgres pool) is read at scrape time through
// RegisterBudget, RegisterLimiters and RegisterPool, so those packages know
// nothing of Prometheus.
package metrics

import (
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "bulwark"

// Registry holds every Bulwark metric. Handler serves it.
var Registry = prometheus.NewRegistry()

// HTTP requests.
var (
	// Requests counts finished HTTP requests by XRPC method (NSID) and
	// status code. Record through ObserveRequest, which bounds the method
	// label.
	Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "http", Name: "requests_total",
		Help: "HTTP requests by XRPC method (NSID; _other outside XRPC or unknown) and status.",
	}, []string{"method", "status"})
	// RequestDuration is the latency of HTTP requests by XRPC method.
	RequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: "http", Name: "request_duration_seconds",
		Help: "HTTP request latency by XRPC method, from headers read to handler return.",
		// From a refusal (tens of µs) to a large CAR export (a minute).
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"method"})
	// RefusalCoolOffs counts connections held after a 429 or 503 for the
	// Retry-After it gave (pds: --refusal-cooloff).
	RefusalCoolOffs = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "http", Name: "refusal_cooloffs_total",
		Help: "Connections whose next request was held back for the Retry-After of a 429/503 they were just sent.",
	})
)

// The getRepo CAR cache (pds).
var (
	// CARCacheHits counts getRepo answers served from a cached file.
	CARCacheHits = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "car_cache", Name: "hits_total",
		Help: "Whole-repository getRepo answers served from the CAR cache.",
	})
	// CARCacheBuilds counts exports into the cache.
	CARCacheBuilds = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "car_cache", Name: "builds_total",
		Help: "Repository exports written into the CAR cache.",
	})
	// CARCacheBytes is what the cached files count against --car-cache:
	// their sizes, each at least 64 KiB.
	CARCacheBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "car_cache", Name: "bytes",
		Help: "Bytes of cached getRepo answers counted against --car-cache (each file at least 64 KiB).",
	})
)

// Writes first (package priority): the pauses background streams take
// while writes are in flight.
var (
	BackgroundPauses = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "priority", Name: "background_pauses_total",
		Help: "Chunks of background streams (getRepo exports, blob downloads, firehose backfill pages) held back while writes were in flight.",
	})
	BackgroundPauseTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "priority", Name: "background_pause_timeouts_total",
		Help: "Background pauses that ended at the maximum pause with writes still in flight.",
	})
	BackgroundPauseSeconds = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "priority", Name: "background_pause_seconds_total",
		Help: "Time background streams spent paused while writes were in flight.",
	})
)

// Repository and event log.
var (
	// Commits counts repository commits written (one per write
	// transaction that committed).
	Commits = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "commits_total",
		Help: "Repository commits written.",
	})
	// CommitGroups counts transactions that stored several repos' commits
	// together (repo group commit); GroupedCommits the commits they held.
	CommitGroups = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "commit_groups_total",
		Help: "Transactions that stored several repositories' commits together (group commit).",
	})
	GroupedCommits = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "grouped_commits_total",
		Help: "Commits stored in a group with others; divided by commit_groups_total, the mean group size.",
	})
	// CommitGroupRetries counts groups refused whole (one member's root had
	// moved or its session was refused) whose commits were then stored one
	// by one.
	CommitGroupRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "commit_group_retries_total",
		Help: "Commit groups refused whole (a member's root moved or its session was refused) and stored commit by commit.",
	})
	// StaleRoots counts one-round-trip commits refused because another
	// process had moved the repo's root; each was rebuilt on the cached
	// tree caught up (StateRefreshes) or, failing that, redone under the
	// row lock.
	StaleRoots = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "stale_roots_total",
		Help: "Commits built on a cached tree whose root another process had moved; rebuilt on the tree caught up, or redone under the repo's row lock.",
	})
	// StateRefreshes counts cached trees caught up with another process's
	// commits (the records or nodes written since read, the unchanged
	// nodes kept) instead of being loaded whole.
	StateRefreshes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "state_refreshes_total",
		Help: "Cached repository trees caught up with another node's commits (from the records or MST nodes written since) instead of loaded whole.",
	})
	// CommitPlans counts commits worked out and signed, stored or not: a
	// commit built again on a tree caught up with another node's commits
	// counts twice, so plans over commits is the work redone.
	CommitPlans = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "commit_plans_total",
		Help: "Commits worked out and signed, including those rebuilt after another node moved the repository; divided by commits_total, the work per commit.",
	})
	// RootChecks counts reads of a repository's root before a commit is
	// worked out, made while other processes are moving it on (a
	// round-robin balancer over nodes): one read instead of a commit
	// worked out twice.
	RootChecks = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "root_checks_total",
		Help: "Reads of a repository's root before a commit to it is worked out, while other nodes are writing to it.",
	})
	// RepoHints counts other nodes' commit hints by outcome: kept (of a
	// repository this node caches), uncached, old (of a commit the cached
	// tree has) and duplicate (ignored), malformed,
	// applied (a cached tree brought up to another node's commit) and
	// dropped (a repository other nodes write to while this one does
	// not: its cached tree is let go).
	RepoHints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "repo", Name: "hints_total",
		Help: "Other nodes' commit hints by outcome: kept, uncached, old, duplicate, malformed, applied (a cached tree caught up without a database read), dropped (a tree written elsewhere let go).",
	}, []string{"outcome"})
	// ClusterHintDatagrams counts the commit hints a node sent and read
	// (cluster/hints.go), and the datagrams dropped unread: not_peer (not
	// from a running node's advertised address), bad_tag (malformed or
	// not tagged with the cluster's key), stale (sent more than 10 s
	// before or after this node's clock).
	ClusterHintDatagrams = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "cluster", Name: "hint_datagrams_total",
		Help: "Commit hint datagrams by outcome: sent (one per peer), received, and dropped unread: not_peer, bad_tag, stale (clocks out of sync).",
	}, []string{"outcome"})
	// EventLogLastSeq is the highest seq the sequencer has assigned.
	EventLogLastSeq = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "eventlog", Name: "last_seq",
		Help: "Highest firehose seq assigned by the sequencer.",
	})
	// SequencerLag is how long the events of the last sequenced batch
	// waited between their commit and getting a seq, at most: measured
	// from the first wake-up (a local writer's commit) the batch answered.
	// Batches found by polling, of other nodes' commits, leave it as it is.
	SequencerLag = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "sequencer", Name: "lag_seconds",
		Help: "Longest commit-to-seq delay in the last sequenced batch.",
	})
	// SequencerPending is the number of committed events still waiting
	// for a seq after the last batch: 0 when the batch took every one,
	// else counted (at most once a second, up to ten batches' worth).
	SequencerPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "sequencer", Name: "pending_events",
		Help: "Committed events not yet sequenced.",
	})
)

// Cluster: the leases of the jobs one node runs at a time (package
// cluster).
var (
	// LeaseHeld is 1 for each lease this node holds, 0 for those it wants.
	LeaseHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "cluster", Name: "lease_held",
		Help: "1 for each singleton job's lease this node holds (sequencer, firehose-pruner, blob-collector, ...), 0 for those another node holds.",
	}, []string{"lease"})
	// LeaseTakeovers counts the leases this node took.
	LeaseTakeovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "cluster", Name: "lease_takeovers_total",
		Help: "Leases this node took (at start, or from a holder that stopped renewing).",
	}, []string{"lease"})
)

// Firehose.
var (
	// FirehoseSubscribers is the number of open subscribeRepos streams.
	FirehoseSubscribers = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "firehose", Name: "subscribers",
		Help: "Open subscribeRepos connections.",
	})
	// FirehoseFrames counts frames sent to subscribers, by kind (commit,
	// sync, identity, account, info, error).
	FirehoseFrames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "firehose", Name: "frames_sent_total",
		Help: "Frames sent to subscribers, by event kind.",
	}, []string{"kind"})
	// FirehoseBytes counts frame bytes sent to subscribers.
	FirehoseBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "firehose", Name: "bytes_sent_total",
		Help: "Frame bytes sent to subscribers.",
	})
	// FirehoseRefused counts subscribeRepos upgrades refused before the
	// WebSocket handshake, by reason (rate_limited, too_many_from_client,
	// server_full).
	FirehoseRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "firehose", Name: "upgrades_refused_total",
		Help: "subscribeRepos upgrades refused before the handshake, by reason.",
	}, []string{"reason"})
	// FirehoseDisconnects counts subscribeRepos streams that ended, by
	// reason (client_closed, read_timeout, write_error, write_timeout,
	// consumer_too_slow, future_cursor, shutdown, other).
	FirehoseDisconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "firehose", Name: "disconnects_total",
		Help: "subscribeRepos streams ended, by reason.",
	}, []string{"reason"})
)

func init() {
	Registry.MustRegister(
		// Beside the defaults, how long runnable goroutines waited for a
		// CPU (go_sched_latencies_seconds): on a server whose requests are
		// mostly waits, this is where contention for the cores shows.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)},
		)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: namespace}),
		Requests, RequestDuration, RefusalCoolOffs,
		CARCacheHits, CARCacheBuilds, CARCacheBytes,
		BackgroundPauses, BackgroundPauseTimeouts, BackgroundPauseSeconds,
		Commits, CommitGroups, GroupedCommits, CommitGroupRetries, StaleRoots, StateRefreshes, CommitPlans, RootChecks, RepoHints, ClusterHintDatagrams,
		EventLogLastSeq, SequencerLag, SequencerPending, LeaseHeld, LeaseTakeovers,
		FirehoseSubscribers, FirehoseFrames, FirehoseBytes, FirehoseRefused, FirehoseDisconnects,
		budgetCollector, exportSlotsCollector, passwordSlotsCollector, limiterCollector, poolCollector,
	)
}

// Handler serves the registry in the Prometheus exposition format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{
		// A metric that fails to collect is reported in the scrape rather
		// than failing it: the rest are still worth having.
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// MaxMethodLabels bounds the distinct method labels of the HTTP metrics.
// The method comes from the URL, so without a bound a client could create
// a time series per made-up NSID.
const MaxMethodLabels = 256

// OtherMethod is the method label of requests outside /xrpc, and of any
// method past MaxMethodLabels.
const OtherMethod = "_other"

// methods is the set of method labels in use.
var methods = &labelSet{max: MaxMethodLabels}

// ObserveRequest records one finished HTTP request. method should be the
// NSID of a registered XRPC method (not a raw path: unknown names are
// attacker-chosen), or "" for anything else. HEAD counts as the GET it
// mirrors: the method label is the NSID, not the HTTP verb.
func ObserveRequest(method string, status int, elapsed time.Duration) {
	method = methods.label(method)
	Requests.WithLabelValues(method, strconv.Itoa(status)).Inc()
	RequestDuration.WithLabelValues(method).Observe(elapsed.Seconds())
}

// CountRequest records one finished request in Requests only, leaving the
// latency histogram alone: for streams (subscribeRepos, CAR exports, blob
// downloads) whose duration is the client's reading pace, not the
// server's latency.
func CountRequest(method string, status int) {
	Requests.WithLabelValues(methods.label(method), strconv.Itoa(status)).Inc()
}

// labelSet admits up to max distinct label values; the rest become
// OtherMethod.
type labelSet struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func (s *labelSet) label(m string) string {
	if m == "" {
		return OtherMethod
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[m] {
		return m
	}
	if len(s.seen) >= s.max {
		return OtherMethod
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[m] = true
	return m
}
