package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/mail"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Defaults that operators see in --help and the README. They are constants so
// that tests and documentation can refer to them by name.
const (
	DefaultListen            = "127.0.0.1:2583"
	DefaultHostname          = "localhost"
	DefaultDataDir           = "./data"
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
	// then served over plain http (see PublicURL).
	Hostname string
	// DataDir holds the managed Postgres cluster, blobs and generated
	// secrets. Finalize makes it absolute.
	DataDir string
	// DatabaseURL points at an external Postgres. Empty means Bulwark runs
	// its own cluster under DataDir/postgres.
	DatabaseURL string
	// AdminPassword is the HTTP Basic password (user "admin") for admin
	// methods. Empty means generated into the data dir by EnsureSecrets.
	AdminPassword string
	// JWTSecret signs session tokens. Empty means generated.
	JWTSecret string
	// PLCURL is the PLC directory used to create and update did:plc
	// identities.
	PLCURL string
	// PLCRotationKey is the server's PLC rotation key, a K-256 private key
	// as hex or multibase. Empty means generated.
	PLCRotationKey string
	// HandleDomains are the handle suffixes users may register under, each
	// starting with a dot. Default: "." + the host part of Hostname.
	HandleDomains []string
	// BlobDir stores blobs on disk. Default: DataDir/blobs.
	BlobDir string
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
	// InflightBudget caps the bytes of expensive responses (CAR exports,
	// firehose backfill, blobs) in flight at once. Zero means sized from
	// the process's memory by Finalize (budget.DefaultCapacity).
	InflightBudget int64
	// InflightQueue is how many expensive requests may wait for the budget
	// (and, separately, for a getRepo export slot); one more is answered
	// 503 ServiceOverloaded at once. Zero means no waiting at all.
	InflightQueue int
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
	// InviteRequired makes createAccount require an invite code.
	InviteRequired bool
	// ContactEmail is published in describeServer.
	ContactEmail string
	// PrivacyPolicyURL is published in describeServer.
	PrivacyPolicyURL string
	// TermsOfServiceURL is published in describeServer.
	TermsOfServiceURL string
	// ShutdownTimeout bounds how long a stopping server waits for
	// requests in flight before closing them.
	ShutdownTimeout time.Duration
	// LogLevel is the minimum level logged.
	LogLevel slog.Level
	// LogFormat is "text" (readable) or "json" (for log collectors).
	LogFormat string

	// envErrs collects environment values that did not parse; Validate
	// reports them so that a typo in the environment stops the server
	// instead of silently using a default.
	envErrs []error
}

// DefaultConfig returns the documented defaults. Settings that derive from
// others (HandleDomains, BlobDir, InflightBudget) stay empty until Finalize.
func DefaultConfig() *Config {
	return &Config{
		Listen:                 DefaultListen,
		Hostname:               DefaultHostname,
		DataDir:                DefaultDataDir,
		PLCURL:                 DefaultPLCURL,
		AppViewURL:             DefaultAppViewURL,
		AppViewDID:             DefaultAppViewDID,
		FirehoseRate:           DefaultFirehoseRate,
		FirehoseBurst:          DefaultFirehoseBurst,
		FirehoseRetention:      DefaultFirehoseRetention,
		FirehoseMaxSubscribers: DefaultFirehoseMaxSubscribers,
		FirehoseMaxPerClient:   DefaultFirehoseMaxPerClient,
		FirehoseOversizeSync:   true,
		MaxJSONBody:            DefaultMaxJSONBody,
		InflightQueue:          DefaultInflightQueue,
		BackgroundMaxPause:     DefaultBackgroundMaxPause,
		RefusalCoolOff:         DefaultRefusalCoolOff,
		CARCache:               DefaultCARCache,
		ExportRate:             DefaultExportRate,
		GCPercent:              DefaultGCPercent,
		RateLimitMaxKeys:       ratelimit.DefaultMaxKeys,
		ShutdownTimeout:        DefaultShutdownTimeout,
		BlobMaxBytes:           DefaultBlobMaxBytes,
		BlobTempTTL:            DefaultBlobTempTTL,
		LogLevel:               slog.LevelInfo,
		LogFormat:              DefaultLogFormat,
	}
}

// Finalize fills the defaults that derive from other settings, normalises
// paths and the host name, and validates the result. Call it once, after
// flags are parsed.
func (c *Config) Finalize() error {
	c.Hostname = strings.ToLower(strings.TrimSpace(c.Hostname))
	if c.DataDir != "" {
		abs, err := filepath.Abs(c.DataDir)
		if err != nil {
			return settingError("data-dir", "%v", err)
		}
		c.DataDir = abs
	}
	if len(c.HandleDomains) == 0 && c.Hostname != "" {
		c.HandleDomains = []string{"." + c.host()}
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
	return c.Validate()
}

// Validate checks every setting and returns an error naming the first bad
// one by flag and environment variable.
func (c *Config) Validate() error {
	if len(c.envErrs) > 0 {
		return errors.Join(c.envErrs...)
	}
	if err := checkListen(c.Listen); err != nil {
		return settingError("listen", "%v", err)
	}
	if err := checkHostname(c.Hostname); err != nil {
		return settingError("hostname", "%v", err)
	}
	if c.DataDir == "" {
		return settingError("data-dir", "must not be empty")
	}
	if c.DatabaseURL != "" {
		if _, err := pgconn.ParseConfig(c.DatabaseURL); err != nil {
			// pgconn redacts the password in its parse errors.
			return settingError("database-url", "%v", err)
		}
	}
	if c.AdminPassword != "" && strings.TrimSpace(c.AdminPassword) != c.AdminPassword {
		return settingError("admin-password", "must not begin or end with white space")
	}
	if c.JWTSecret != "" && len(c.JWTSecret) < MinJWTSecretLen {
		return settingError("jwt-secret", "must be at least %d bytes long (got %d)", MinJWTSecretLen, len(c.JWTSecret))
	}
	if err := checkURL(c.PLCURL); err != nil {
		return settingError("plc-url", "%v", err)
	}
	if c.PLCRotationKey != "" {
		if _, err := ParseRotationKey(c.PLCRotationKey); err != nil {
			return settingError("plc-rotation-key", "%v", err)
		}
	}
	if len(c.HandleDomains) == 0 {
		return settingError("handle-domains", "at least one domain is needed")
	}
	for _, d := range c.HandleDomains {
		if err := checkHandleDomain(d); err != nil {
			return settingError("handle-domains", "%q: %v", d, err)
		}
	}
	if c.BlobDir == "" {
		return settingError("blob-dir", "must not be empty")
	}
	for _, u := range c.Crawlers {
		if err := checkURL(u); err != nil {
			return settingError("crawlers", "%q: %v", u, err)
		}
	}
	if (c.AppViewURL == "") != (c.AppViewDID == "") {
		return settingError("appview-url", "--appview-url and --appview-did are set together or not at all")
	}
	if c.AppViewURL != "" {
		if err := checkURL(c.AppViewURL); err != nil {
			return settingError("appview-url", "%v", err)
		}
		if _, err := syntax.ParseDID(c.AppViewDID); err != nil {
			return settingError("appview-did", "%v", err)
		}
	}
	if c.FirehoseRate.Count <= 0 || c.FirehoseRate.Per <= 0 {
		return settingError("firehose-rate", "must be positive, like 1/min")
	}
	if c.FirehoseBurst < 1 {
		return settingError("firehose-burst", "must be at least 1")
	}
	if c.FirehoseRetention <= 0 {
		return settingError("firehose-retention", "must be positive")
	}
	if c.FirehoseMaxSubscribers < 1 {
		return settingError("firehose-max-subscribers", "must be at least 1")
	}
	if c.FirehoseMaxPerClient < 1 {
		return settingError("firehose-max-per-client", "must be at least 1")
	}
	if c.MetricsListen != "" {
		if err := checkListen(c.MetricsListen); err != nil {
			return settingError("metrics-listen", "%v", err)
		}
		if c.MetricsListen == c.Listen {
			return settingError("metrics-listen", "must differ from --listen: metrics and pprof are private")
		}
	}
	if c.BlobMaxBytes < 1 {
		return settingError("blob-max-bytes", "must be positive")
	}
	if c.BlobTempTTL <= 0 {
		return settingError("blob-temp-ttl", "must be positive")
	}
	if c.BlobS3Endpoint != "" {
		if err := checkURL(c.BlobS3Endpoint); err != nil {
			return settingError("blob-s3-endpoint", "%v", err)
		}
		if c.BlobS3Bucket == "" {
			return settingError("blob-s3-bucket", "must be set with --blob-s3-endpoint")
		}
	}
	if (c.BlobS3AccessKey == "") != (c.BlobS3SecretKey == "") {
		return settingError("blob-s3-access-key", "--blob-s3-access-key and --blob-s3-secret-key are set together or not at all")
	}
	if c.InflightBudget < 1<<20 {
		return settingError("inflight-budget", "must be at least 1MiB")
	}
	if c.InflightQueue < 0 {
		return settingError("inflight-queue", "must not be negative")
	}
	if c.BackgroundMaxPause < 0 || c.BackgroundMaxPause > MaxBackgroundMaxPause {
		return settingError("background-max-pause", "must be between 0 (never pause) and %s", MaxBackgroundMaxPause)
	}
	if c.CARCache < 0 {
		return settingError("car-cache", "must not be negative")
	}
	if c.ExportRate < 0 {
		return settingError("export-rate", "must not be negative")
	}
	if c.GCPercent != -1 && c.GCPercent < 10 {
		return settingError("gc-percent", "must be -1 (off) or at least 10, not %d", c.GCPercent)
	}
	if c.RefusalCoolOff < 0 || c.RefusalCoolOff > MaxRefusalCoolOff {
		return settingError("refusal-cooloff", "must be between 0 (never hold) and %s", MaxRefusalCoolOff)
	}
	if _, err := c.RateLimitPolicies(); err != nil {
		return settingError("ratelimits", "%v", err)
	}
	if c.RateLimitMaxKeys < 1 {
		return settingError("ratelimit-max-keys", "must be at least 1")
	}
	if c.MaxJSONBody < 1024 {
		return settingError("max-json-body", "must be at least 1KiB")
	}
	if c.ContactEmail != "" {
		if _, err := mail.ParseAddress(c.ContactEmail); err != nil {
			return settingError("contact-email", "%v", err)
		}
	}
	if c.PrivacyPolicyURL != "" {
		if err := checkURL(c.PrivacyPolicyURL); err != nil {
			return settingError("privacy-policy-url", "%v", err)
		}
	}
	if c.TermsOfServiceURL != "" {
		if err := checkURL(c.TermsOfServiceURL); err != nil {
			return settingError("terms-of-service-url", "%v", err)
		}
	}
	if c.ShutdownTimeout <= 0 {
		return settingError("shutdown-timeout", "must be positive")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return settingError("log-format", "must be text or json, not %q", c.LogFormat)
	}
	return nil
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

// IsLocal reports whether the host name is a development one (see
// PublicURL).
func (c *Config) IsLocal() bool {
	if strings.Contains(c.Hostname, ":") && !strings.HasSuffix(c.Hostname, "]") {
		return true
	}
	h := c.host()
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || strings.HasSuffix(h, ".test") {
		return true
	}
	if ip, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return ip.IsLoopback() || ip.IsPrivate()
	}
	return false
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

// settingError names a setting by flag and environment variable, so that
// the message helps whichever of the two the operator used.
func settingError(flagName, format string, args ...any) error {
	return fmt.Errorf("invalid --%s (%s): %s", flagName, envName(flagName), fmt.Sprintf(format, args...))
}

// envName maps a flag name to its environment variable: data-dir →
// BULWARK_DATA_DIR.
func envName(flagName string) string {
	return "BULWARK_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", addr, err)
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil && !hostnameRE.MatchString(host) {
			return fmt.Errorf("%q: bad host %q", addr, host)
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: bad port %q", addr, port)
	}
	return nil
}

// hostnameRE matches a DNS name of one or more labels (letters, digits,
// inner hyphens), lower case.
var hostnameRE = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func checkHostname(h string) error {
	if h == "" {
		return errors.New("must not be empty")
	}
	if strings.Contains(h, "/") {
		return fmt.Errorf("%q: a host name, not a URL (no scheme or path)", h)
	}
	host := h
	if strings.Contains(h, ":") {
		var port string
		var err error
		host, port, err = net.SplitHostPort(h)
		if err != nil {
			return fmt.Errorf("%q: %v", h, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: bad port %q", h, port)
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() {
			return nil
		}
	}
	if len(host) > 253 {
		return fmt.Errorf("%q: longer than 253 characters", h)
	}
	if !hostnameRE.MatchString(host) {
		return fmt.Errorf("%q is not a valid host name", h)
	}
	return nil
}

func checkURL(raw string) error {
	if raw == "" {
		return errors.New("must not be empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want an http:// or https:// URL", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", raw)
	}
	return nil
}

func checkHandleDomain(d string) error {
	if !strings.HasPrefix(d, ".") {
		return errors.New("must start with '.' (like .example.com)")
	}
	// A domain is valid when a handle under it would be.
	if _, err := syntax.ParseHandle("a" + d); err != nil {
		return err
	}
	return nil
}
