package config

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/db"
)

// setting ties one Config field to its flag and environment variable.
type setting struct {
	flag  string
	usage string
	value flag.Value
}

// settings lists every setting of c in the order --help and the start-up
// log show them. Adding a setting is one line here plus the field.
func (c *Config) settings() []setting {
	return []setting{
		{"listen", "address to serve on (host:port)", (*stringValue)(&c.Listen)},
		{"hostname", "public host name (default localhost:<listen port>); service DID is did:web:<hostname>; host:port, localhost, *.test and private addresses are served over http (local use)", (*stringValue)(&c.Hostname)},
		{"data-dir", "directory for the managed Postgres, blobs and generated secrets", (*stringValue)(&c.DataDir)},
		{"database-url", "external Postgres URL; unset = run a managed Postgres under <data-dir>/postgres", (*databaseURLValue)(&c.DatabaseURL)},
		{"postgres-settings", "comma-separated name=value settings for the managed Postgres, over Bulwark's own, like shared_buffers=4GB (ignored with --database-url)", (*listValue)(&c.PostgresSettings)},
		{"database-direct-url", "the same database without a transaction-mode pooler (PgBouncer), for LISTEN, migrations and imports; needed when --database-url goes through one", (*databaseURLValue)(&c.DatabaseDirectURL)},
		{"lease-timeout", "how long a node's lease on a singleton job (sequencer, retention, blob collection, relay watch) lasts unrenewed; a frozen node is replaced within this plus a sixth", (*durationValue)(&c.LeaseTimeout)},
		{"cluster-hint-addr", "UDP ip:port (a private address every node reaches) on which this node hears the other nodes' commits, so round robin over nodes needs no extra database read per write; unset = off", (*stringValue)(&c.ClusterHintAddr)},
		{"admin-password", "HTTP Basic password (user admin) for admin methods; unset = generated into <data-dir>/secrets", (*secretValue)(&c.AdminPassword)},
		{"jwt-secret", "session token signing key (at least 32 bytes); unset = generated", (*secretValue)(&c.JWTSecret)},
		{"plc-url", "PLC directory URL (default: a development PLC in this server for a local host name, else https://plc.directory)", (*stringValue)(&c.PLCURL)},
		{"plc-rotation-key", "PDS PLC rotation key (K-256 private key, hex or multibase); unset = generated", (*secretValue)(&c.PLCRotationKey)},
		{"handle-domains", "comma-separated handle suffixes users may register, like .example.com (default .<hostname>)", (*listValue)(&c.HandleDomains)},
		{"blob-dir", "blob storage directory (default <data-dir>/blobs)", (*stringValue)(&c.BlobDir)},
		{"blob-dir-shared", "--blob-dir is a shared file system every node mounts at the same path (else a second node on the database refuses to start)", (*boolValue)(&c.BlobDirShared)},
		{"blob-max-bytes", "largest blob upload, like 100MiB", (*byteSize)(&c.BlobMaxBytes)},
		{"blob-temp-ttl", "how long an uploaded blob no record refers to is kept", (*durationValue)(&c.BlobTempTTL)},
		{"blob-s3-bucket", "keep blobs in this S3-compatible bucket instead of --blob-dir", (*stringValue)(&c.BlobS3Bucket)},
		{"blob-s3-endpoint", "S3 service base URL, like https://s3.example.com (default AWS)", (*stringValue)(&c.BlobS3Endpoint)},
		{"blob-s3-region", "S3 bucket region (default us-east-1)", (*stringValue)(&c.BlobS3Region)},
		{"blob-s3-access-key", "S3 access key; unset = AWS default credential chain", (*stringValue)(&c.BlobS3AccessKey)},
		{"blob-s3-secret-key", "S3 secret key", (*secretValue)(&c.BlobS3SecretKey)},
		{"crawlers", "comma-separated relay URLs to notify with requestCrawl", (*listValue)(&c.Crawlers)},
		{"appview-url", "default proxy target for methods served elsewhere", (*stringValue)(&c.AppViewURL)},
		{"appview-did", "service DID of --appview-url", (*stringValue)(&c.AppViewDID)},
		{"mod-service-url", "moderation service tools.ozone.* methods are proxied to (empty = none)", (*stringValue)(&c.ModServiceURL)},
		{"mod-service-did", "service DID of --mod-service-url", (*stringValue)(&c.ModServiceDID)},
		{"report-service-url", "service com.atproto.moderation.createReport is proxied to (empty = none)", (*stringValue)(&c.ReportServiceURL)},
		{"report-service-did", "service DID of --report-service-url", (*stringValue)(&c.ReportServiceDID)},
		{"proxy-header-timeout", "longest wait for a proxied service's response headers", (*durationValue)(&c.ProxyHeaderTimeout)},
		{"proxy-body-timeout", "longest wait for more of a proxied service's response body", (*durationValue)(&c.ProxyBodyTimeout)},
		{"proxy-max-response", "largest response body a proxied service may send, like 10MiB", (*byteSize)(&c.ProxyMaxResponse)},
		{"proxy-total-timeout", "longest a proxied service's answer may take, from the request sent to its last byte", (*durationValue)(&c.ProxyTotalTimeout)},
		{"proxy-min-rate", "slowest average rate, bytes a second, a proxied answer may arrive at once it has taken 10s, like 8KiB", (*byteSize)(&c.ProxyMinRate)},
		{"proxy-max-per-client", "most proxied requests one client (account, or anonymous address) may have in flight", (*intValue)(&c.ProxyMaxPerClient)},
		{"dns-server", "DNS server (ip or ip:port) outbound lookups ask: handle and lexicon TXT records, hosts to connect to; unset = the system resolver", (*stringValue)(&c.DNSServer)},
		{"proxy-allow-private", "comma-separated CIDRs outbound requests (service proxy, handle and did:web resolution, OAuth client metadata, relay watch) may reach although not public, over http too", (*prefixListValue)(&c.ProxyAllowPrivate)},
		{"firehose-rate", "subscribeRepos admissions per client, like 1/min, 10/h, 2/s", (*Rate)(&c.FirehoseRate)},
		{"firehose-burst", "subscribeRepos admissions a client may make at once", (*intValue)(&c.FirehoseBurst)},
		{"firehose-retention", "how long firehose events are kept for cursor replay", (*durationValue)(&c.FirehoseRetention)},
		{"firehose-allow", "comma-separated CIDRs (known relays) exempt from the subscribeRepos rate and per-client cap", (*prefixListValue)(&c.FirehoseAllow)},
		{"firehose-max-subscribers", "most concurrent subscribeRepos connections on this node", (*intValue)(&c.FirehoseMaxSubscribers)},
		{"firehose-max-per-client", "most concurrent subscribeRepos connections from one client", (*intValue)(&c.FirehoseMaxPerClient)},
		{"firehose-oversize-sync", "serve stored events over a protocol limit as #sync (false only to reproduce a relay's failure)", (*boolValue)(&c.FirehoseOversizeSync)},
		{"trusted-proxies", "comma-separated CIDRs whose X-Forwarded-For is believed", (*prefixListValue)(&c.TrustedProxies)},
		{"metrics-listen", "private address for /metrics and pprof; unset = off", (*stringValue)(&c.MetricsListen)},
		{"relay-watch-interval", "how often each relay in --crawlers is asked how far it has read our firehose (0 = off)", (*durationValue)(&c.RelayWatchInterval)},
		{"relay-watch-timeout", "longest wait for one relay's answer", (*durationValue)(&c.RelayWatchTimeout)},
		{"relay-behind-events", "a relay trailing our newest event by more seqs is behind", (*intValue)(&c.RelayBehindEvents)},
		{"relay-behind-for", "a relay whose oldest unread event is older than this is behind", (*durationValue)(&c.RelayBehindFor)},
		{"relay-stuck-checks", "a relay at the same seq this many checks in a row while newer events exist is stuck", (*intValue)(&c.RelayStuckChecks)},
		{"relay-stuck-for", "a relay is stuck only once the first event after its seq is this old (longer than relays take to save their position)", (*durationValue)(&c.RelayStuckFor)},
		{"alert-webhook", "URL receiving incidents (stuck relay or consumer, 503 storms) as JSON POSTs; unset = none", (*secretValue)(&c.AlertWebhook)},
		{"alert-webhook-format", "body of the alert POSTs: auto (Slack's and Discord's webhook URLs get their message shape, others JSON), json, slack or discord", (*stringValue)(&c.AlertWebhookFormat)},
		{"overload-storm-threshold", "503 refusals within a minute that make a storm (alerted once)", (*intValue)(&c.OverloadStormThreshold)},
		{"admin-console", "operator console at /admin/: public (this listener), private (--metrics-listen only) or off", (*stringValue)(&c.AdminConsole)},
		{"inflight-budget", "bytes of expensive responses in flight at once, like 512MiB (default: a quarter of memory, 16MiB-1GiB)", (*byteSize)(&c.InflightBudget)},
		{"inflight-queue", "expensive requests that may wait for the in-flight budget before the next gets 503 (0 = no waiting)", (*intValue)(&c.InflightQueue)},
		{"password-queue", "password checks (logins, sign-ups, password changes) that may wait for a hash slot before the next gets 503 (0 = no waiting)", (*intValue)(&c.PasswordQueue)},
		{"password-wait", "longest a password check waits for a hash slot before 503", (*durationValue)(&c.PasswordWait)},
		{"background-max-pause", "longest a getRepo export or blob download pauses per chunk while writes are in flight (0 = never)", (*durationValue)(&c.BackgroundMaxPause)},
		{"car-cache", "bytes of whole-repository getRepo answers kept on disk under the data dir, like 1GiB (0 = none)", (*byteSize)(&c.CARCache)},
		{"export-rate", "bytes a second all getRepo answers share, like 32MiB (0 = unpaced)", (*byteSize)(&c.ExportRate)},
		{"gc-percent", "Go garbage collector target (GOGC) beside a soft memory limit of half of memory; GOGC in the environment wins (-1 = off)", (*intValue)(&c.GCPercent)},
		{"refusal-cooloff", "longest a connection just answered 429/503 is held (for its Retry-After) before its next request is read (0 = never)", (*durationValue)(&c.RefusalCoolOff)},
		{"ratelimits", "rate limits: empty = the reference PDS's, off, or overrides like global=6000/5m;createSession=10/5m,100/1d", (*stringValue)(&c.RateLimits)},
		{"ratelimit-max-keys", "clients (IPs, DIDs) each rate limiter tracks at once", (*intValue)(&c.RateLimitMaxKeys)},
		{"max-json-body", "largest JSON procedure body, like 2MiB", (*byteSize)(&c.MaxJSONBody)},
		{"max-import-size", "largest repository CAR importRepo accepts, like 1GiB", (*byteSize)(&c.MaxImportSize)},
		{"import-slots", "repository imports running at once on this process, one per account (0 = a quarter of the database pool, at least 2)", (*intValue)(&c.ImportSlots)},
		{"import-min-rate", "slowest average rate an importRepo body may arrive at after its first 30 s, like 32KiB (bytes a second)", (*byteSize)(&c.ImportMinRate)},
		{"import-deadline", "longest an importRepo body may take to arrive in all", (*durationValue)(&c.ImportDeadline)},
		{"import-allow-oversize", "let importRepo store records over the per-record limits instead of refusing the repository", (*boolValue)(&c.ImportAllowOversize)},
		{"oauth-allow-private-clients", "development only: accept OAuth client_id URLs on IP addresses, ports and local names, fetched from private networks", (*boolValue)(&c.OAuthAllowPrivateClients)},
		{"invite-required", "require an invite code to create an account (default: true for a public host name, false for a local one)", &trackedBool{v: &c.InviteRequired, set: &c.inviteSet}},
		{"contact-email", "contact address published by describeServer", (*stringValue)(&c.ContactEmail)},
		{"privacy-policy-url", "privacy policy link published by describeServer", (*stringValue)(&c.PrivacyPolicyURL)},
		{"terms-of-service-url", "terms of service link published by describeServer", (*stringValue)(&c.TermsOfServiceURL)},
		{"smtp-url", "mail server for codes and admin messages: smtps://user:pass@host:465 or smtp://user:pass@host:587 (STARTTLS); unset = mail is held (bulwark admin account tokens)", (*smtpURLValue)(&c.SMTPURL)},
		{"email-from", "sender of mail, like 'Example PDS <noreply@example.com>'; required with --smtp-url", (*stringValue)(&c.EmailFrom)},
		{"email-templates", "directory of mail templates replacing the built-in ones file by file", (*stringValue)(&c.EmailTemplates)},
		{"shutdown-timeout", "how long a stopping server waits for requests in flight", (*durationValue)(&c.ShutdownTimeout)},
		{"log-level", "minimum log level: debug, info, warn, error", (*levelValue)(&c.LogLevel)},
		{"log-format", "log format: text or json", (*stringValue)(&c.LogFormat)},
		{"list-max-bytes", "record bytes one listRecords page holds at most, like 4MiB (the page ends early, with a cursor)", (*byteSize)(&c.ListMaxBytes)},
	}
}

// RegisterFlags binds every setting to a flag on fs. An environment variable
// (BULWARK_<FLAG_NAME>) that is set becomes the flag's default, so that
// flags override the environment and the environment overrides the built-in
// defaults; an empty variable counts as unset. A value in the environment
// that does not parse is reported by Validate, naming the variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.registerFlags(fs, os.LookupEnv)
}

func (c *Config) registerFlags(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) {
	for _, s := range c.settings() {
		env := envName(s.flag)
		// An empty variable counts as unset: compose files and scripts
		// pass through optional settings as FOO=${FOO:-}.
		if v, ok := lookupEnv(env); ok && strings.TrimSpace(v) != "" {
			if err := s.value.Set(v); err != nil {
				c.envErrs = append(c.envErrs, fmt.Errorf("invalid %s: %v", env, err))
			}
		}
		fs.Var(s.value, s.flag, s.usage+" [$"+env+"]")
	}
}

// RedactedText is the text that stands in for a secret in logs.
const RedactedText = "(redacted)"

// Setting is one setting's effective value, as `bulwark config` prints it.
type Setting struct {
	// Flag is the flag's name, without dashes (data-dir).
	Flag string
	// Env is the environment variable (BULWARK_DATA_DIR).
	Env string
	// Value is the value in flag syntax, with secrets "(redacted)" and
	// the database URL's password removed.
	Value string
}

// Settings returns every setting, in --help order, safe to print.
func (c *Config) Settings() []Setting {
	all := c.settings()
	out := make([]Setting, len(all))
	for i, s := range all {
		out[i] = Setting{Flag: s.flag, Env: envName(s.flag), Value: s.value.String()}
	}
	return out
}

// LogValue renders the effective configuration for the start-up log, keyed
// by flag name, with secrets replaced and the database URL's password
// removed. It makes a Config safe to pass to slog as is.
func (c *Config) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 32)
	for _, s := range c.settings() {
		attrs = append(attrs, slog.String(s.flag, s.value.String()))
	}
	return slog.GroupValue(attrs...)
}

// Redacted returns a copy of c that is safe to print: secrets that are set
// read "(redacted)" and the database URL has no password.
func (c *Config) Redacted() *Config {
	r := *c
	r.envErrs = nil
	for _, p := range []*string{&r.AdminPassword, &r.JWTSecret, &r.PLCRotationKey, &r.BlobS3SecretKey, &r.AlertWebhook} {
		if *p != "" {
			*p = RedactedText
		}
	}
	r.DatabaseURL = RedactDatabaseURL(r.DatabaseURL)
	r.DatabaseDirectURL = RedactDatabaseURL(r.DatabaseDirectURL)
	r.SMTPURL = RedactSMTPURL(r.SMTPURL)
	return &r
}

// RedactDatabaseURL removes the password from a Postgres connection string
// (URL or key=value form). It is db.RedactURL, so that the server has one
// redaction rule.
func RedactDatabaseURL(s string) string {
	if s == "" {
		return ""
	}
	return db.RedactURL(s)
}

// Rate is an event rate, written like 1/min, 30/h or 5/s (or N/<Go
// duration>, like 1/30s). It is a flag.Value.
type Rate struct {
	// Count events are allowed per Per.
	Count int
	// Per is the interval Count refers to.
	Per time.Duration
}

// Limit converts r for golang.org/x/time/rate.
func (r Rate) Limit() rate.Limit {
	if r.Per <= 0 {
		return 0
	}
	return rate.Limit(float64(r.Count) / r.Per.Seconds())
}

// String formats r the way Set parses it.
func (r *Rate) String() string {
	if r == nil {
		return ""
	}
	unit := r.Per.String()
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "min"
	case time.Hour:
		unit = "h"
	}
	return fmt.Sprintf("%d/%s", r.Count, unit)
}

// Set parses N/unit.
func (r *Rate) Set(s string) error {
	n, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return fmt.Errorf("rate %q: want N/unit, like 1/min", s)
	}
	count, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || count < 1 {
		return fmt.Errorf("rate %q: count must be a positive integer", s)
	}
	var per time.Duration
	switch strings.TrimSpace(unit) {
	case "s", "sec", "second":
		per = time.Second
	case "m", "min", "minute":
		per = time.Minute
	case "h", "hour":
		per = time.Hour
	case "d", "day":
		per = 24 * time.Hour
	default:
		per, err = time.ParseDuration(strings.TrimSpace(unit))
		if err != nil || per <= 0 {
			return fmt.Errorf("rate %q: unknown unit %q (use s, min, h, day or a duration like 30s)", s, unit)
		}
	}
	*r = Rate{Count: count, Per: per}
	return nil
}

type stringValue string

// secretValue is a string setting that never shows its value: --help
// prints flag defaults, and the defaults come from the environment.
type secretValue string

func (v *secretValue) String() string {
	if v == nil || *v == "" {
		return ""
	}
	return RedactedText
}
func (v *secretValue) Set(s string) error { *v = secretValue(strings.TrimSpace(s)); return nil }

// databaseURLValue shows a connection string without its password.
type databaseURLValue string

func (v *databaseURLValue) String() string {
	if v == nil {
		return ""
	}
	return RedactDatabaseURL(string(*v))
}
func (v *databaseURLValue) Set(s string) error {
	*v = databaseURLValue(strings.TrimSpace(s))
	return nil
}

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(strings.TrimSpace(s)); return nil }

// listValue is a comma-separated list; empty items are dropped so that a
// trailing comma is harmless.
type listValue []string

func (v *listValue) String() string { return strings.Join(*v, ",") }
func (v *listValue) Set(s string) error {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*v = out
	return nil
}

type prefixListValue []netip.Prefix

func (v *prefixListValue) String() string {
	parts := make([]string, len(*v))
	for i, p := range *v {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}

// Set takes CIDRs; a bare address means that one host.
func (v *prefixListValue) Set(s string) error {
	var out []netip.Prefix
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			addr, err := netip.ParseAddr(item)
			if err != nil {
				return fmt.Errorf("bad CIDR %q", item)
			}
			out = append(out, netip.PrefixFrom(addr, addr.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			return fmt.Errorf("bad CIDR %q", item)
		}
		out = append(out, p.Masked())
	}
	*v = out
	return nil
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	*v = intValue(n)
	return nil
}

type boolValue bool

func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*v = boolValue(b)
	return nil
}

// trackedBool is a bool setting that remembers being set by a flag or the
// environment, so that a default derived from other settings applies
// only when it was not.
type trackedBool struct {
	v   *bool
	set *bool
}

func (v *trackedBool) String() string {
	if v == nil || v.v == nil {
		return "false"
	}
	return strconv.FormatBool(*v.v)
}
func (v *trackedBool) IsBoolFlag() bool { return true }
func (v *trackedBool) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*v.v, *v.set = b, true
	return nil
}

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a duration like 30s or 72h", s)
	}
	*v = durationValue(d)
	return nil
}

type levelValue slog.Level

func (v *levelValue) String() string { return slog.Level(*v).String() }
func (v *levelValue) Set(s string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return fmt.Errorf("%q is not a log level (debug, info, warn, error)", s)
	}
	*v = levelValue(l)
	return nil
}

// byteSize is a count of bytes, written as a plain integer or with a binary
// suffix: 512KiB, 2MiB, 1GiB (KB/MB/GB are taken as the binary units too;
// nobody sizes buffers in powers of ten on purpose).
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"b", 1},
}

func (v *byteSize) String() string {
	n := int64(*v)
	switch {
	case n != 0 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n != 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n != 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

func (v *byteSize) Set(s string) error {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			mult = u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size like 1048576 or 512MiB", s)
	}
	*v = byteSize(n * mult)
	return nil
}
