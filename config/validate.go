package config

import (
	"errors"
	"fmt"
	"net"
	"net/mail"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgconn"
)

// Validate checks every setting and returns an error naming the first bad
// one by flag and environment variable. The checks run in the order below,
// which is the order errors are reported in when several settings are bad.
func (c *Config) Validate() error {
	if len(c.envErrs) > 0 {
		return errors.Join(c.envErrs...)
	}
	for _, check := range []func() error{
		c.validateServer,
		c.validateIdentity,
		c.validateBlobDir,
		c.validateUpstreams,
		c.validateProxy,
		c.validateFirehose,
		c.validateMetrics,
		c.validateOps,
		c.validateBlobs,
		c.validateLoad,
		c.validateRequests,
		c.validateDescription,
		c.validateEmail,
		c.validateProcess,
		c.validateProtect,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateServer checks where the server listens, its name, where it keeps
// its data, and its secrets.
func (c *Config) validateServer() error {
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
	if err := checkPostgresSettings(c.PostgresSettings); err != nil {
		return settingError("postgres-settings", "%v", err)
	}
	if c.DatabaseDirectURL != "" {
		if c.DatabaseURL == "" {
			return settingError("database-direct-url", "needs --database-url: the managed Postgres is reached directly")
		}
		if _, err := pgconn.ParseConfig(c.DatabaseDirectURL); err != nil {
			return settingError("database-direct-url", "%v", err)
		}
	}
	if c.LeaseTimeout < time.Second || c.LeaseTimeout > time.Minute {
		return settingError("lease-timeout", "must be between 1s and 1m (got %s)", c.LeaseTimeout)
	}
	if c.ClusterHintAddr != "" {
		ap, err := netip.ParseAddrPort(c.ClusterHintAddr)
		switch {
		case err != nil:
			return settingError("cluster-hint-addr", "want ip:port, like 10.0.0.5:2583 (%v)", err)
		case ap.Addr().IsUnspecified() || ap.Port() == 0:
			return settingError("cluster-hint-addr", "the other nodes send to it: give this node's own IP and a port, not %s", c.ClusterHintAddr)
		}
	}
	if c.AdminPassword != "" {
		if err := checkAdminPassword(c.AdminPassword); err != nil {
			return settingError("admin-password", "%v", err)
		}
	}
	if c.JWTSecret != "" && len(c.JWTSecret) < MinJWTSecretLen {
		return settingError("jwt-secret", "must be at least %d bytes long (got %d)", MinJWTSecretLen, len(c.JWTSecret))
	}
	return nil
}

// validateIdentity checks the PLC directory, the rotation key and the
// handle domains accounts are created with.
func (c *Config) validateIdentity() error {
	if err := checkURL(c.PLCURL); err != nil {
		return settingError("plc-url", "%v", err)
	}
	if err := c.validatePLCEndpoint(); err != nil {
		return err
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
	return nil
}

// validateBlobDir checks that blobs have a directory (Finalize derives one
// from the data directory). The other blob settings are validateBlobs'.
func (c *Config) validateBlobDir() error {
	if c.BlobDir == "" {
		return settingError("blob-dir", "must not be empty")
	}
	return nil
}

// validateUpstreams checks the services the server talks to: the relays it
// asks to crawl it and the app view it proxies to.
func (c *Config) validateUpstreams() error {
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
	return nil
}

// validateFirehose checks subscribeRepos admission, connection caps and
// event retention.
func (c *Config) validateFirehose() error {
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
	return nil
}

// validateMetrics checks the private metrics and pprof address.
func (c *Config) validateMetrics() error {
	if c.MetricsListen == "" {
		return nil
	}
	if err := checkListen(c.MetricsListen); err != nil {
		return settingError("metrics-listen", "%v", err)
	}
	if c.MetricsListen == c.Listen {
		return settingError("metrics-listen", "must differ from --listen: metrics and pprof are private")
	}
	return nil
}

// validateBlobs checks blob size and lifetime limits and the S3 store.
func (c *Config) validateBlobs() error {
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
	return nil
}

// validateLoad checks the settings that bound what expensive requests may
// cost: the in-flight byte budget and its queue, background pauses, the
// CAR cache, the export rate, the garbage collector and refusal cool-off.
func (c *Config) validateLoad() error {
	if c.InflightBudget < 1<<20 {
		return settingError("inflight-budget", "must be at least 1MiB")
	}
	if c.InflightQueue < 0 {
		return settingError("inflight-queue", "must not be negative")
	}
	if c.PasswordQueue < 0 {
		return settingError("password-queue", "must not be negative")
	}
	if c.PasswordWait <= 0 || c.PasswordWait > MaxPasswordWait {
		return settingError("password-wait", "must be more than 0 and at most %s", MaxPasswordWait)
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
	return nil
}

// validateRequests checks per-client rate limits and the request body cap.
func (c *Config) validateRequests() error {
	if _, err := c.RateLimitPolicies(); err != nil {
		return settingError("ratelimits", "%v", err)
	}
	if c.RateLimitMaxKeys < 1 {
		return settingError("ratelimit-max-keys", "must be at least 1")
	}
	if c.MaxJSONBody < 1024 {
		return settingError("max-json-body", "must be at least 1KiB")
	}
	if c.MaxImportSize < 1024 {
		return settingError("max-import-size", "must be at least 1KiB")
	}
	if c.ImportSlots < 0 {
		return settingError("import-slots", "must not be negative")
	}
	if c.ImportMinRate < 1 {
		return settingError("import-min-rate", "must be at least 1 byte a second")
	}
	if c.ImportDeadline < time.Second {
		return settingError("import-deadline", "must be at least 1s")
	}
	return nil
}

// validateDescription checks what describeServer publishes.
func (c *Config) validateDescription() error {
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
	return nil
}

// validateProcess checks shutdown and logging.
func (c *Config) validateProcess() error {
	if c.ShutdownTimeout <= 0 {
		return settingError("shutdown-timeout", "must be positive")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return settingError("log-format", "must be text or json, not %q", c.LogFormat)
	}
	return nil
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

// checkPostgresSettings accepts name=value pairs whose name is a Postgres
// setting's shape (letters, digits, underscores, dots), so that nothing but
// one -c argument per pair reaches the postgres command line.
func checkPostgresSettings(settings []string) error {
	for _, kv := range settings {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" || value == "" {
			return fmt.Errorf("%q is not name=value", kv)
		}
		for _, r := range name {
			if !(r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return fmt.Errorf("%q is not a setting name", name)
			}
		}
	}
	return nil
}
