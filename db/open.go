package db

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

// sessionSettings are the server settings a direct connection starts
// with, unless its URL sets them. They bound how long a process that
// froze, or lost its network, holds what its session holds:
//
//   - idle_in_transaction_session_timeout ends a session left in the middle
//     of a transaction (and so its row locks) after a minute, long enough
//     for the slowest work done inside one (a PLC directory call at account
//     creation). Transactions that hold a lock other nodes' writers need
//     set a tighter bound for themselves (repo's commits, 5 s), and those
//     that may legitimately wait on a slow client (getRepo exports) lift it.
//   - the TCP keepalive and user timeout settings make the server notice a
//     client whose host vanished within about half a minute instead of the
//     kernel's two hours.
var sessionSettings = [][2]string{
	{"idle_in_transaction_session_timeout", "60s"},
	{"tcp_keepalives_idle", "10"},
	{"tcp_keepalives_interval", "5"},
	{"tcp_keepalives_count", "3"},
	{"tcp_user_timeout", "30000"},
}

// DefaultConnectTimeout bounds one connection attempt to one host when the
// URL sets no connect_timeout: with several hosts (a failover list), an
// unreachable one is skipped after this instead of after the kernel's
// SYN retries (two minutes).
const DefaultConnectTimeout = 5 * time.Second

// Mode is how a pool reaches Postgres.
type Mode int

const (
	// Direct connections are sessions of their own: the pool keeps
	// prepared statements per connection and sets sessionSettings.
	Direct Mode = iota
	// Pooled connections go through a transaction-mode pooler (PgBouncer):
	// each transaction may run on another server connection, so nothing
	// may outlive a transaction. Statements are described and sent
	// unnamed, and no startup settings are sent (PgBouncer refuses ones
	// it does not know; set them on the role instead).
	Pooled
)

// Open creates a direct pgx pool for url, pings it and returns it. The
// pool holds DefaultMaxConns connections unless url sets pool_max_conns.
// url is only ever logged through RedactURL.
func Open(ctx context.Context, url string, logger *slog.Logger) (*pgxpool.Pool, error) {
	return OpenMode(ctx, url, Direct, logger)
}

// OpenMode is Open for a pool of the given mode.
func OpenMode(ctx context.Context, url string, mode Mode, logger *slog.Logger) (*pgxpool.Pool, error) {
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
	configure(cfg.ConnConfig, url, mode)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db: open %s: %w", RedactURL(url), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("db: connect to %s: %w", RedactURL(url), err)
	}
	logger.Debug("database pool open", "url", RedactURL(url), "max_conns", cfg.MaxConns, "pooled", mode == Pooled)
	return pool, nil
}

// configure applies the connection defaults of mode to cc, leaving what
// url sets itself.
func configure(cc *pgx.ConnConfig, url string, mode Mode) {
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "bulwark"
	}
	if !strings.Contains(url, "connect_timeout") {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	cc.DialFunc = dialer(cc.ConnectTimeout).DialContext
	if mode == Pooled {
		cc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		return
	}
	for _, kv := range sessionSettings {
		if _, ok := cc.RuntimeParams[kv[0]]; !ok {
			cc.RuntimeParams[kv[0]] = kv[1]
		}
	}
}

// Pools are a server's connections to its database: Main for all the
// work, and Sessions for the few things that need one session across
// transactions (LISTEN, the migration lock, an import's staging tables).
// They are the same pool unless Main goes through a transaction-mode
// pooler.
type Pools struct {
	Main, Sessions *pgxpool.Pool
	// Pooled is true when Main goes through a transaction-mode pooler.
	Pooled bool
}

// Close closes both pools.
func (p *Pools) Close() {
	if p.Sessions != nil && p.Sessions != p.Main {
		p.Sessions.Close()
	}
	if p.Main != nil {
		p.Main.Close()
	}
}

// sessionPoolConns is the size of the direct pool beside a pooled one:
// the two LISTEN sessions, migrations and an import or two.
const sessionPoolConns = 6

// OpenPools connects to url and finds out whether it goes through a
// transaction-mode pooler (PgBouncer refuses the session settings, or
// hands two client connections one server connection in turn). If it
// does, directURL must reach the database without one, and is used for
// Sessions; otherwise the error is a *PoolerError. directURL, when set,
// is checked not to be pooled itself.
func OpenPools(ctx context.Context, url, directURL string, logger *slog.Logger) (*Pools, error) {
	if logger == nil {
		logger = slog.Default()
	}
	p := &Pools{}
	main, err := Open(ctx, url, logger)
	switch {
	case refusedSettings(err):
		p.Pooled = true
	case err != nil:
		return nil, err
	default:
		if p.Pooled, err = DetectPooler(ctx, main); err != nil {
			main.Close()
			return nil, err
		}
		if p.Pooled {
			main.Close()
		} else {
			p.Main = main
		}
	}
	if p.Pooled {
		if directURL == "" {
			return nil, &PoolerError{}
		}
		if p.Main, err = OpenMode(ctx, url, Pooled, logger); err != nil {
			return nil, err
		}
	}
	p.Sessions = p.Main
	if directURL == "" {
		return p, nil
	}
	if !strings.Contains(directURL, "pool_max_conns") {
		directURL = withParam(directURL, "pool_max_conns", fmt.Sprint(sessionPoolConns))
	}
	if p.Sessions, err = Open(ctx, directURL, logger); err != nil {
		p.Sessions = nil
		p.Close()
		if refusedSettings(err) {
			return nil, &PoolerError{Direct: true}
		}
		return nil, err
	}
	if directPooled, err := DetectPooler(ctx, p.Sessions); err != nil || directPooled {
		p.Close()
		if err == nil {
			err = &PoolerError{Direct: true}
		}
		return nil, err
	}
	return p, nil
}

// PoolerError is OpenPools' refusal of a transaction-mode pooler without a
// direct connection beside it.
type PoolerError struct {
	// Direct is true when it is the direct URL that goes through one.
	Direct bool
}

func (e *PoolerError) Error() string {
	if e.Direct {
		return "db: the direct database URL also goes through a connection pooler in transaction mode"
	}
	return "db: the database URL goes through a connection pooler in transaction mode (PgBouncer?), and no direct URL is set"
}

// refusedSettings reports whether err is PgBouncer refusing a startup
// setting it does not pass on: a sure sign of PgBouncer in front.
func refusedSettings(err error) bool {
	return err != nil && strings.Contains(err.Error(), "unsupported startup parameter")
}

// DetectPooler reports whether pool's connections share server sessions
// between transactions, as a transaction-mode pooler makes them do: twice
// over, one client connection holds a transaction open while a second
// starts one, and the backend process each is served by is compared
// (through a pooler, the second gets the server connection the first just
// gave back, or the first comes back on another). A direct connection is
// always served by its own backend.
func DetectPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	pid := func(c *pgxpool.Conn) (int32, error) {
		var p int32
		err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	for range 5 {
		first, err := pid(a)
		if err != nil {
			return false, err
		}
		if _, err := b.Exec(ctx, "BEGIN", pgx.QueryExecModeSimpleProtocol); err != nil {
			return false, err
		}
		second, err := pid(b)
		if err != nil {
			return false, err
		}
		again, err := pid(a)
		if _, cerr := b.Exec(ctx, "COMMIT", pgx.QueryExecModeSimpleProtocol); err == nil {
			err = cerr
		}
		if err != nil {
			return false, err
		}
		if second == first || again != first {
			return true, nil
		}
	}
	return false, nil
}

// withParam adds key=value to a URL or keyword/value connection string.
func withParam(conn, key, value string) string {
	if !strings.Contains(conn, "://") {
		return conn + " " + key + "=" + value
	}
	sep := "?"
	if strings.Contains(conn, "?") {
		sep = "&"
	}
	return conn + sep + url.QueryEscape(key) + "=" + url.QueryEscape(value)
}

// ServerSetting returns a server setting as the session sees it.
func ServerSetting(ctx context.Context, pool *pgxpool.Pool, name string) (string, error) {
	var v string
	err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
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
