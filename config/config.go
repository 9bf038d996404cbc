package config

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/cluster"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// Defaults that operators see in --help and the README. They are constants so
// that tests and documentation can refer to them by name.
const (
	DefaultListen = "127.0.0.1:2583"
	// DefaultHost is the host name a server gets when none is set, with
	// the port it listens on: localhost:2583.
	DefaultHost    = "localhost"
	DefaultDataDir = "./data"
	// DefaultPLCURL is the PLC directory of a server with a public host
	// name and no PLC URL set. A local one runs its own (DevPLC).
	DefaultPLCURL            = "https://plc.directory"
	DefaultAppViewURL        = "https://api.bsky.app"
	DefaultAppViewDID        = "did:web:api.bsky.app"
	DefaultFirehoseBurst     = 5
	DefaultFirehoseRetention = 72 * time.Hour
	// DefaultFirehoseMaxSubscribers caps concurrent subscribeRepos
	// connections per process; an idle one costs ~23 KB, a backfilling
	// one up to a page of events.
	DefaultFirehoseMaxSubscribers = 5000
	// DefaultFirehoseMaxPerClient caps concurrent subscribeRepos
	// connections from one client address.
	DefaultFirehoseMaxPerClient = 8
	DefaultShutdownTimeout      = 30 * time.Second
	DefaultLogFormat            = "text"

	// DefaultBlobMaxBytes is the largest blob uploadBlob accepts: 100 MiB,
	// the reference PDS installer's PDS_BLOB_UPLOAD_LIMIT.
	DefaultBlobMaxBytes = 100 << 20
	// DefaultBlobTempTTL is how long an uploaded blob that no record
	// refers to is kept before it is deleted.
	DefaultBlobTempTTL = time.Hour

	// DefaultMaxJSONBody is the largest JSON procedure body accepted: the
	// data-model limit for one JSON record (MAX_JSON_RECORD_SIZE, 2 MiB).
	// A record at that limit cannot be committed anyway (the commit limits
	// are smaller), so nothing useful is refused by this cap, and it stops a
	// client from making the server parse an arbitrarily large document.
	DefaultMaxJSONBody = 2 * 1024 * 1024

	// DefaultMaxImportSize is the largest repository CAR importRepo
	// accepts: 1 GiB, far beyond any repository the reference PDS lets a
	// user build, and streamed to the database, not held in memory.
	DefaultMaxImportSize = 1 << 30

	// DefaultImportMinRate is the slowest average rate, in bytes a second,
	// an importRepo body may arrive at (after the grace period every long
	// body gets): 32 KiB/s, about 260 kbit/s, a quarter of a slow home
	// uplink (1 Mbit/s), so a link that dips or is shared still passes,
	// while a client that trickles is cut off four times sooner than
	// under the rate of other long bodies.
	DefaultImportMinRate = 32 << 10
	// DefaultImportDeadline is the longest an importRepo body may take to
	// arrive, however fast it starts: 4 hours. A 1 GiB CAR (the default
	// --max-import-size) over a 1 Mbit/s uplink takes about 2.4 hours, so
	// the largest import completes on a slow home link with room to
	// spare, and a slot is never held longer than this plus the import's
	// own work (a few minutes for 1 GiB).
	DefaultImportDeadline = 4 * time.Hour

	// MinJWTSecretLen is the shortest session-token key accepted: an HS256
	// key should carry at least as many bytes as the hash output.
	MinJWTSecretLen = 32
)

// DefaultFirehoseRate is the default subscribeRepos admission rate per
// client: one connection a minute (with DefaultFirehoseBurst on top). Relays
// redial at once after a failed connection, so a generous rate here is what
// turns one misbehaving relay into thousands of connections a second.
var DefaultFirehoseRate = Rate{Count: 1, Per: time.Minute}

// Config is every setting of a Bulwark server. DefaultConfig returns the
// values documented in the README; Finalize fills the settings whose
// defaults derive from others and validates the result.
type Config struct {
	// Listen is the address the public HTTP server binds (host:port).
	Listen string
	// Hostname is the public host name. The service DID is
	// did:web:<Hostname>. A host:port form is allowed for local use and is
	// then served over plain http (see PublicURL). Empty means
	// localhost:<the port of Listen>, filled in by Finalize (and by Bound
	// once a listener on port 0 has its port).
	Hostname string
	// DataDir holds the managed Postgres cluster, blobs and generated
	// secrets. Finalize makes it absolute.
	DataDir string
	// DatabaseURL points at an external Postgres. Empty means Bulwark runs
	// its own cluster under DataDir/postgres.
	DatabaseURL string
	// PostgresSettings are name=value server settings for the managed
	// Postgres, applied over Bulwark's own (a larger shared_buffers on a
	// large server). Unused with DatabaseURL.
	PostgresSettings []string
	// DatabaseDirectURL reaches the same database without a connection
	// pooler, for the work that needs one session across transactions
	// (LISTEN, the migration lock, an import's staging tables), when
	// DatabaseURL goes through a pooler in transaction mode. Empty: the
	// server checks that DatabaseURL keeps sessions, and refuses to start
	// when it does not.
	DatabaseDirectURL string
	// LeaseTimeout is how long a node's lease on a singleton job (the
	// firehose sequencer, retention, blob collection, the relay watch)
	// lasts without a renewal: a node that freezes or is cut off is
	// replaced within LeaseTimeout plus a sixth of it.
	LeaseTimeout time.Duration
	// ClusterHintAddr, when set, is the UDP ip:port this node reads the
	// other nodes' commit hints on, and that it tells them to send to
	// (cluster/hints.go): with it, a node keeps its cached trees current
	// with the others' commits, and round robin over nodes costs no read
	// per commit. Every node must reach it; keep it private.
	ClusterHintAddr string
	// AdminPassword is the HTTP Basic password (user "admin") for admin
	// methods. Empty means generated into the data dir by EnsureSecrets.
	AdminPassword string
	// JWTSecret signs session tokens. Empty means generated.
	JWTSecret string
	// PLCURL is the PLC directory used to create and update did:plc
	// identities. Empty means, after Finalize: the development directory
	// in this server (DevPLC) when the host name is local, else
	// DefaultPLCURL. A public directory never gets a plain-http PDS URL:
	// Validate refuses that combination.
	PLCURL string
	// DevPLC is set by Finalize when the server runs the development PLC
	// directory itself, stored in its database and served at PLCURL
	// (which is then PublicURL): the host name is local (IsLocalHost) and
	// PLCURL was empty or named this server. Its DIDs exist nowhere else.
	DevPLC bool
	// PLCRotationKey is the server's PLC rotation key, a K-256 private key
	// as hex or multibase. Empty means generated.
	PLCRotationKey string
	// HandleDomains are the handle suffixes users may register under, each
	// starting with a dot. Default: "." + the host part of Hostname, or
	// ".test" when that cannot end a handle (localhost, an IP address).
	HandleDomains []string
	// BlobDir stores blobs on disk. Default: DataDir/blobs.
	BlobDir string
	// BlobDirShared declares BlobDir a directory every node mounts at the
	// same path (a network file system): without it, a node with blobs on
	// disk refuses to run beside another on the same database.
	BlobDirShared bool
	// BlobMaxBytes is the largest blob uploadBlob accepts, in bytes.
	BlobMaxBytes int64
	// BlobTempTTL is how long an uploaded blob no record refers to is
	// kept (also after its last record is deleted).
	BlobTempTTL time.Duration
	// BlobS3Bucket, when set, keeps blobs in this S3-compatible bucket
	// instead of BlobDir.
	BlobS3Bucket string
	// BlobS3Endpoint is the S3 service's base URL; empty means AWS.
	BlobS3Endpoint string
	// BlobS3Region is the bucket's region (default us-east-1).
	BlobS3Region string
	// BlobS3AccessKey and BlobS3SecretKey are static S3 credentials;
	// empty means the AWS default chain (environment, instance role).
	BlobS3AccessKey string
	// BlobS3SecretKey goes with BlobS3AccessKey.
	BlobS3SecretKey string
	// Crawlers are relay base URLs notified (requestCrawl) after writes.
	Crawlers []string
	// AppViewURL and AppViewDID are the default proxy target for XRPC
	// methods this server does not implement itself.
	AppViewURL string
	// AppViewDID is the service DID of AppViewURL (the `aud` of service
	// auth tokens sent to it).
	AppViewDID string
	// ModServiceURL is the moderation service tools.ozone.* methods are
	// proxied to (empty: none).
	ModServiceURL string
	// ModServiceDID is the service DID of ModServiceURL.
	ModServiceDID string
	// ReportServiceURL is where com.atproto.moderation.createReport goes
	// without an atproto-proxy header (empty: none).
	ReportServiceURL string
	// ReportServiceDID is the service DID of ReportServiceURL.
	ReportServiceDID string
	// ProxyHeaderTimeout bounds the wait for a proxied service's response
	// headers once the request is sent.
	ProxyHeaderTimeout time.Duration
	// ProxyBodyTimeout bounds each wait for more of a proxied service's
	// response body.
	ProxyBodyTimeout time.Duration
	// ProxyMaxResponse bounds a proxied service's response body, in bytes.
	ProxyMaxResponse int64
	// ProxyTotalTimeout bounds a proxied answer from the request being
	// sent to its last byte.
	ProxyTotalTimeout time.Duration
	// ProxyMinRate is the slowest average rate, in bytes a second, a
	// proxied answer may arrive at once it has taken 10 s.
	ProxyMinRate int64
	// ProxyMaxPerClient caps the proxied requests one client (an account,
	// or an anonymous caller's address, an IPv6 /64 counting as one) may
	// have in flight at once.
	ProxyMaxPerClient int
	// ProxyAllowPrivate are networks the server's outbound requests
	// (service proxy, handle and did:web resolution, OAuth client
	// metadata, relay watch) may reach although they are not public, over
	// http or https: a private deployment's app view, local development.
	// Empty: public unicast addresses only, https only.
	ProxyAllowPrivate []netip.Prefix
	// DNSServer is the DNS server ("ip" or "ip:port", port 53 when not
	// given) the server's outbound lookups ask: handle TXT records,
	// lexicon authorities (_lexicon TXT records, for OAuth permission
	// sets) and the names of the hosts it connects to. Empty: the
	// system's resolver.
	DNSServer string
	// FirehoseRate is how many subscribeRepos connections one client may
	// open, refilled continuously (token bucket).
	FirehoseRate Rate
	// FirehoseBurst is the token-bucket size for FirehoseRate.
	FirehoseBurst int
	// FirehoseRetention is how long events stay in the log for cursor
	// replay; older cursors get #info OutdatedCursor and the whole window.
	FirehoseRetention time.Duration
	// FirehoseAllow lists networks (known relays) exempt from the
	// subscribeRepos rate and per-client cap.
	FirehoseAllow []netip.Prefix
	// FirehoseMaxSubscribers caps concurrent subscribeRepos connections
	// on this process.
	FirehoseMaxSubscribers int
	// FirehoseMaxPerClient caps concurrent subscribeRepos connections
	// from one client address (an IPv6 /64 counts as one).
	FirehoseMaxPerClient int
	// FirehoseOversizeSync serves a stored event that breaks a protocol
	// limit (imported, legacy, repaired) as #sync instead of as stored.
	// Turn it off only to reproduce what a relay does with such an event.
	FirehoseOversizeSync bool
	// TrustedProxies are the networks whose X-Forwarded-For headers are
	// believed when deciding a client's address. Empty: none, the TCP peer
	// is the client.
	TrustedProxies []netip.Prefix
	// MetricsListen is a private address for /metrics and pprof. Empty
	// means off.
	MetricsListen string
	// RelayWatchInterval is how often each relay in Crawlers is asked how
	// far it has read this server's firehose (getHostStatus). Zero turns
	// the relay watch off.
	RelayWatchInterval time.Duration
	// RelayWatchTimeout bounds each call the relay watch makes.
	RelayWatchTimeout time.Duration
	// RelayBehindEvents: a relay trailing our head by more seqs than this
	// is behind.
	RelayBehindEvents int
	// RelayBehindFor: a relay whose oldest unread event was written longer
	// ago than this is behind.
	RelayBehindFor time.Duration
	// RelayStuckChecks: a relay reporting the same seq on this many checks
	// in a row while newer events exist, for at least RelayStuckFor, is
	// stuck.
	RelayStuckChecks int
	// RelayStuckFor: how long the first event after a stuck relay's seq
	// must have existed; longer than the relays save their position
	// (indigo's: every 4 s), so that a healthy relay between two saves is
	// not taken for stuck.
	RelayStuckFor time.Duration
	// AlertWebhook receives incidents (a stuck relay, a stuck firehose
	// consumer, a storm of 503s) as JSON POSTs. Empty means none. It is
	// treated as a secret: webhook URLs often carry a token.
	AlertWebhook string
	// AlertWebhookFormat is the shape alerts are POSTed in: auto (a Slack
	// or Discord webhook URL gets a chat message, any other URL the alert
	// as JSON), json, slack or discord.
	AlertWebhookFormat string
	// OverloadStormThreshold is how many 503 refusals within a minute make
	// a storm, alerted once.
	OverloadStormThreshold int
	// AdminConsole is where the operator console is served: ConsolePublic
	// (/admin/ on the public listener), ConsolePrivate (/admin/ on
	// MetricsListen only) or ConsoleOff.
	AdminConsole string
	// InflightBudget caps the bytes of expensive responses (CAR exports,
	// firehose backfill, blobs) in flight at once. Zero means sized from
	// the process's memory by Finalize (budget.DefaultCapacity).
	InflightBudget int64
	// InflightQueue is how many expensive requests may wait for the budget
	// (and, separately, for a getRepo export slot); one more is answered
	// 503 ServiceOverloaded at once. Zero means no waiting at all.
	InflightQueue int
	// PasswordQueue is how many password checks (logins, sign-ups,
	// password changes) may wait, first come first served, for one of the
	// hash slots (one per core); one more is answered 503
	// ServiceOverloaded at once. Zero means no waiting at all.
	PasswordQueue int
	// PasswordWait is the longest a password check waits for a hash slot
	// before it is answered 503 ServiceOverloaded.
	PasswordWait time.Duration
	// BackgroundMaxPause bounds how long a background stream (a getRepo
	// export, a blob download) pauses before each chunk while writes are
	// in flight, so that writes get the CPU first (package priority).
	// Zero means never pause.
	BackgroundMaxPause time.Duration
	// CARCache is how many bytes of whole-repository getRepo answers are
	// kept on disk (DataDir/car-cache), so a repository asked for again
	// unchanged is a file copy, not a database export. Zero means none.
	CARCache int64
	// GCPercent is the garbage collector's target (GOGC) the server runs
	// with, beside a soft memory limit (ApplyGC); -1 turns the
	// proportional collector off. GOGC in the environment wins.
	GCPercent int
	// ExportRate is the bytes a second all getRepo answers together are
	// sent at, at most; zero means as fast as clients read.
	ExportRate int64
	// RefusalCoolOff bounds how long a connection whose request was just
	// refused (429, 503) is held, for the Retry-After it was given, before
	// its next request is read. Zero means never hold. Connections from
	// trusted proxies are never held.
	RefusalCoolOff time.Duration
	// RateLimits is empty (the reference PDS's limits), "off", or
	// overrides like "global=6000/5m;createSession=10/5m,100/1d"; see
	// RateLimitPolicies.
	RateLimits string
	// RateLimitMaxKeys bounds the clients (IPs, DIDs) each rate limiter
	// tracks at once, so that a flood of distinct addresses costs bounded
	// memory.
	RateLimitMaxKeys int
	// MaxJSONBody is the largest JSON procedure body accepted, in bytes.
	MaxJSONBody int64
	// MaxImportSize is the largest repository CAR importRepo accepts, in
	// bytes; a larger one is refused (413) while it streams in.
	MaxImportSize int64
	// ImportAllowOversize lets importRepo store records over the
	// per-record limits (relays drop them) instead of refusing the
	// repository. They never go out in a #commit.
	ImportAllowOversize bool
	// ImportSlots bounds the repository imports running at once on this
	// process (each holds a database connection while its CAR streams
	// in); an account runs one at a time whatever this says. 0 means a
	// quarter of the database pool, at least 2.
	ImportSlots int
	// ImportMinRate is the slowest average rate, in bytes a second, an
	// importRepo body may arrive at once its grace period is over.
	ImportMinRate int64
	// ImportDeadline is the longest an importRepo body may take to
	// arrive in all.
	ImportDeadline time.Duration
	// OAuthAllowPrivateClients lets OAuth apps publish their client
	// metadata at an IP address, a port or a local name (localhost,
	// *.local, ...), fetched from loopback and private networks too. For
	// development only: on a public server it lets anyone who starts a
	// sign-in make the server fetch from its own network.
	OAuthAllowPrivateClients bool
	// InviteRequired makes createAccount require an invite code. Unless
	// the flag or environment sets it, Finalize turns it on for a public
	// host name (as the reference PDS does); a local one stays open.
	InviteRequired bool
	// ContactEmail is published in describeServer.
	ContactEmail string
	// PrivacyPolicyURL is published in describeServer.
	PrivacyPolicyURL string
	// TermsOfServiceURL is published in describeServer.
	TermsOfServiceURL string
	// SMTPURL is the mail server codes and messages are sent through
	// (email.ParseSMTPURL: smtps://user:pass@host:465,
	// smtp://user:pass@host:587 with STARTTLS). Empty means no mail is
	// sent: it is held, and an operator reads the codes with
	// `bulwark admin account tokens`.
	SMTPURL string
	// EmailFrom is the sender of mail, "Name <addr>" or "addr"; required
	// with SMTPURL.
	EmailFrom string
	// EmailTemplates is a directory of mail templates that replace the
	// built-in ones file by file (see package email). Empty means the
	// built-in ones.
	EmailTemplates string
	// ShutdownTimeout bounds how long a stopping server waits for
	// requests in flight before closing them.
	ShutdownTimeout time.Duration
	// LogLevel is the minimum level logged.
	LogLevel slog.Level
	// LogFormat is "text" (readable) or "json" (for log collectors).
	LogFormat string
	// ListMaxBytes bounds the record bytes of one listRecords page (and
	// of a getBlocks answer held at once): a page ends early, with a
	// cursor, rather than pass it.
	ListMaxBytes int64

	// hostnameDerived records that Finalize made Hostname up from Listen,
	// so that Bound may correct its port.
	hostnameDerived bool
	// inviteSet records that the flag or environment set InviteRequired.
	inviteSet bool
	// secretFiles are the secrets EnsureSecrets keeps in the data dir.
	secretFiles []SecretFile

	// envErrs collects environment values that did not parse; Validate
	// reports them so that a typo in the environment stops the server
	// instead of silently using a default.
	envErrs []error
}

// DefaultConfig returns the documented defaults. Settings that derive from
// others (Hostname, PLCURL, HandleDomains, BlobDir, InflightBudget,
// InviteRequired) stay empty until Finalize.
func DefaultConfig() *Config {
	return &Config{
		Listen:                 DefaultListen,
		DataDir:                DefaultDataDir,
		AppViewURL:             DefaultAppViewURL,
		AppViewDID:             DefaultAppViewDID,
		ModServiceURL:          DefaultModServiceURL,
		ModServiceDID:          DefaultModServiceDID,
		ReportServiceURL:       DefaultReportServiceURL,
		ReportServiceDID:       DefaultReportServiceDID,
		ProxyHeaderTimeout:     DefaultProxyHeaderTimeout,
		ProxyBodyTimeout:       DefaultProxyBodyTimeout,
		ProxyMaxResponse:       DefaultProxyMaxResponse,
		ProxyTotalTimeout:      DefaultProxyTotalTimeout,
		ProxyMinRate:           DefaultProxyMinRate,
		ProxyMaxPerClient:      DefaultProxyMaxPerClient,
		FirehoseRate:           DefaultFirehoseRate,
		FirehoseBurst:          DefaultFirehoseBurst,
		FirehoseRetention:      DefaultFirehoseRetention,
		FirehoseMaxSubscribers: DefaultFirehoseMaxSubscribers,
		FirehoseMaxPerClient:   DefaultFirehoseMaxPerClient,
		FirehoseOversizeSync:   true,
		MaxJSONBody:            DefaultMaxJSONBody,
		MaxImportSize:          DefaultMaxImportSize,
		ImportMinRate:          DefaultImportMinRate,
		ImportDeadline:         DefaultImportDeadline,
		InflightQueue:          DefaultInflightQueue,
		PasswordQueue:          DefaultPasswordQueue,
		PasswordWait:           DefaultPasswordWait,
		BackgroundMaxPause:     DefaultBackgroundMaxPause,
		RefusalCoolOff:         DefaultRefusalCoolOff,
		CARCache:               DefaultCARCache,
		ExportRate:             DefaultExportRate,
		GCPercent:              DefaultGCPercent,
		RateLimitMaxKeys:       ratelimit.DefaultMaxKeys,
		RelayWatchInterval:     relaywatch.DefaultInterval,
		RelayWatchTimeout:      relaywatch.DefaultTimeout,
		RelayBehindEvents:      relaywatch.DefaultBehindEvents,
		RelayBehindFor:         relaywatch.DefaultBehindFor,
		RelayStuckFor:          relaywatch.DefaultStuckFor,
		RelayStuckChecks:       relaywatch.DefaultStuckChecks,
		OverloadStormThreshold: alert.DefaultStormThreshold,
		AlertWebhookFormat:     string(alert.FormatAuto),
		AdminConsole:           ConsolePublic,
		ShutdownTimeout:        DefaultShutdownTimeout,
		BlobMaxBytes:           DefaultBlobMaxBytes,
		BlobTempTTL:            DefaultBlobTempTTL,
		LeaseTimeout:           cluster.DefaultLeaseTTL,
		LogLevel:               slog.LevelInfo,
		LogFormat:              DefaultLogFormat,
		ListMaxBytes:           DefaultListMaxBytes,
	}
}

// Finalize fills the defaults that derive from other settings, normalises
// paths and the host name, and validates the result. Call it once, after
// flags are parsed.
func (c *Config) Finalize() error {
	c.Hostname = strings.ToLower(strings.TrimSpace(c.Hostname))
	if c.Hostname == "" {
		c.Hostname = hostnameFor(c.Listen)
		c.hostnameDerived = true
	}
	if c.DataDir != "" {
		abs, err := filepath.Abs(c.DataDir)
		if err != nil {
			return settingError("data-dir", "%v", err)
		}
		c.DataDir = abs
	}
	if len(c.HandleDomains) == 0 && c.Hostname != "" {
		c.HandleDomains = []string{handleDomainFor(c.host())}
	}
	for i, d := range c.HandleDomains {
		c.HandleDomains[i] = strings.ToLower(d)
	}
	if c.BlobDir == "" && c.DataDir != "" {
		c.BlobDir = filepath.Join(c.DataDir, "blobs")
	}
	if c.BlobDir != "" {
		abs, err := filepath.Abs(c.BlobDir)
		if err != nil {
			return settingError("blob-dir", "%v", err)
		}
		c.BlobDir = abs
	}
	if c.InflightBudget == 0 {
		c.InflightBudget = budget.DefaultCapacity()
	}
	c.deriveIdentity()
	return c.Validate()
}

// ServiceDID is the server's own DID: did:web:<hostname>. A port is
// percent-encoded as the did:web method requires (did:web:localhost%3A2583).
func (c *Config) ServiceDID() string {
	return "did:web:" + strings.ReplaceAll(c.Hostname, ":", "%3A")
}

// PublicURL is the base URL clients reach the server at: https://<hostname>,
// or http://<hostname> when the host name carries a port or is local
// (localhost, *.localhost, *.test, a loopback or private IP address). Those
// forms exist for development, where there is no TLS terminator in front.
func (c *Config) PublicURL() string {
	if c.IsLocal() {
		return "http://" + c.Hostname
	}
	return "https://" + c.Hostname
}

// IsLocal reports whether the server is served over plain http (see
// PublicURL): its host name carries a port or IsLocalHost.
func (c *Config) IsLocal() bool {
	if strings.Contains(c.Hostname, ":") && !strings.HasSuffix(c.Hostname, "]") {
		return true
	}
	return c.IsLocalHost()
}

// IsLocalHost reports whether the host name, without its port, names this
// machine or a private network (plc.IsLocalHost: localhost, *.localhost,
// *.test, loopback and private addresses). Such a server runs its own
// development PLC and lets anyone sign up unless told otherwise.
func (c *Config) IsLocalHost() bool {
	return plc.IsLocalHost(c.host())
}

// host is Hostname without a port.
func (c *Config) host() string {
	if h, _, err := net.SplitHostPort(c.Hostname); err == nil {
		return h
	}
	return c.Hostname
}

// NewLogger builds the process logger from LogLevel and LogFormat.
func (c *Config) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
