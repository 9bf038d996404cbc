package db

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// redacted replaces passwords in URLs meant for logs.
const redacted = "xxxxx"

// DefaultMaxConns is the pool size Open uses when the URL does not set
// pool_max_conns: a PDS request mostly waits on Postgres, so a few
// connections per core keep the cores busy without swamping a small server.
func DefaultMaxConns() int32 {
	return int32(max(8, 4*runtime.GOMAXPROCS(0)))
}

// Open creates a pgx pool for url, pings it and returns it. The pool holds
// DefaultMaxConns connections unless url sets pool_max_conns. url is only
// ever logged through RedactURL.
func Open(ctx context.Context, url string, logger *slog.Logger) (*pgxpool.Pool, error) {
	if logger == nil {
		logger = slog.Default()
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgconn already hides the password in its parse errors; the URL
		// itself is not repeated here for the same reason.
		return nil, fmt.Errorf("db: parse database url: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns()
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "bulwark"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db: open %s: %w", RedactURL(url), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("db: connect to %s: %w", RedactURL(url), err)
	}
	logger.Debug("database pool open", "url", RedactURL(url), "max_conns", cfg.MaxConns)
	return pool, nil
}

// dsnPassword matches password=... in keyword/value connection strings,
// quoted or not.
var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlPassword is the fallback for URLs net/url refuses: user:secret@host.
var urlPassword = regexp.MustCompile(`(://[^:/@]*:)[^@]*@`)

// RedactURL returns url with any password replaced by "xxxxx", for logs and
// error messages. It understands postgres:// URLs (user info and the
// password query parameter) and keyword/value strings.
func RedactURL(rawURL string) string {
	if !strings.Contains(rawURL, "://") {
		return dsnPassword.ReplaceAllString(rawURL, "${1}"+redacted)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		s := urlPassword.ReplaceAllString(rawURL, "${1}"+redacted+"@")
		return dsnPassword.ReplaceAllString(s, "${1}"+redacted)
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redacted)
		u.RawQuery = q.Encode()
	}
	return u.String()
}
