package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	gomail "github.com/wneessen/go-mail"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Defaults of Config.
const (
	DefaultMaxAttempts     = 10
	DefaultRetryBase       = 30 * time.Second
	DefaultRetryMax        = time.Hour
	DefaultPollInterval    = 30 * time.Second
	DefaultBatchSize       = 20
	DefaultSendTimeout     = 30 * time.Second
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultFailedRetention = 30 * 24 * time.Hour
)

// pruneEvery is how often Run prunes old rows.
const pruneEvery = 10 * time.Minute

// Config configures a Mailer. The zero value works: no SMTP server, so
// every mail is held in the outbox, where PendingTokens reads the codes.
type Config struct {
	// SMTP is the server to send through (ParseSMTPURL of
	// BULWARK_SMTP_URL); nil holds every mail.
	SMTP *SMTPConfig
	// From is the sender (BULWARK_EMAIL_FROM), "Name <addr>" or "addr";
	// required with SMTP.
	From string
	// Hostname is the server's public host name, shown in mail (default
	// "localhost").
	Hostname string
	// TemplateDir holds an operator's templates (KIND.subject.txt,
	// KIND.txt, KIND.html, and layout.html, the page the HTML templates
	// are drawn in); a file missing there falls back to the embedded
	// default. Empty = defaults only.
	TemplateDir string
	// TLSConfig is the base TLS configuration for the SMTP connection
	// (RootCAs for a private CA); nil = system roots. ServerName defaults
	// to the SMTP host, MinVersion to TLS 1.2.
	TLSConfig *tls.Config
	// TokenTTL is how long a mailed code is valid (default DefaultTokenTTL).
	TokenTTL time.Duration
	// MaxAttempts is how many times a mail is tried before it is marked
	// failed (default DefaultMaxAttempts).
	MaxAttempts int
	// RetryBase is the wait after the first failed attempt; each further
	// failure doubles it (default DefaultRetryBase).
	RetryBase time.Duration
	// RetryMax caps the wait between attempts (default DefaultRetryMax).
	RetryMax time.Duration
	// PollInterval is how often Run looks for mail due for a retry; new
	// mail wakes it at once through NOTIFY (default DefaultPollInterval).
	PollInterval time.Duration
	// BatchSize is how many mails one connection to the SMTP server
	// carries at most (default DefaultBatchSize).
	BatchSize int
	// SendTimeout bounds connecting and each SMTP command (default
	// DefaultSendTimeout).
	SendTimeout time.Duration
	// Sessions, when set, is a pool reaching Postgres directly (not
	// through a transaction-mode pooler), for the worker's LISTEN
	// session. Default: the Mailer's pool.
	Sessions *pgxpool.Pool
	// Lease is how long a claimed mail is left to the node sending it
	// before another may try (default twice SendTimeout times BatchSize,
	// at least a minute).
	Lease time.Duration
	// Retention is how long sent and cancelled mail is kept (default
	// DefaultRetention).
	Retention time.Duration
	// FailedRetention is how long failed mail is kept for inspection
	// (default DefaultFailedRetention).
	FailedRetention time.Duration
	// RecipientLimit, when set, limits the mail sent to one address
	// (keyed by RecipientKey), whichever account or flow asks: a code
	// mail over it is refused with *RecipientLimitError. Admin messages
	// are exempt. Nil = no limit.
	RecipientLimit *ratelimit.Limiter
	// Registerer receives the mailer's metrics; nil = not registered.
	Registerer prometheus.Registerer
	// Logger is the logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Hostname == "" {
		c.Hostname = "localhost"
	}
	if c.TokenTTL <= 0 {
		c.TokenTTL = DefaultTokenTTL
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryBase <= 0 {
		c.RetryBase = DefaultRetryBase
	}
	if c.RetryMax <= 0 {
		c.RetryMax = DefaultRetryMax
	}
	c.RetryMax = max(c.RetryMax, c.RetryBase)
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.Lease <= 0 {
		c.Lease = max(2*c.SendTimeout*time.Duration(c.BatchSize), time.Minute)
	}
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.FailedRetention <= 0 {
		c.FailedRetention = DefaultFailedRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Mailer issues codes, queues mail in the Postgres outbox and, while Run
// (or Start) is active, sends it. Its embedded Tokens share its clock and
// code lifetime.
type Mailer struct {
	Tokens

	pool    *pgxpool.Pool
	cfg     Config
	log     *slog.Logger
	tpl     templateSet
	client  *gomail.Client // nil: no SMTP, mail is held
	from    string
	msgHost string // host part of Message-IDs
	metrics *metricSet
	wake    chan struct{}

	runMu     sync.Mutex
	stop      context.CancelFunc
	done      chan struct{}
	lastPrune time.Time
}

// New checks cfg, loads the templates (a broken override is an error) and
// returns a Mailer over pool's outbox. It does not contact the SMTP server.
func New(pool *pgxpool.Pool, cfg Config) (*Mailer, error) {
	cfg.setDefaults()
	m := &Mailer{
		Tokens: Tokens{TTL: cfg.TokenTTL, Now: cfg.Now},
		pool:   pool,
		cfg:    cfg,
		log:    cfg.Logger.With("component", "email"),
		wake:   make(chan struct{}, 1),
	}
	m.msgHost = cfg.Hostname
	if h, _, err := net.SplitHostPort(cfg.Hostname); err == nil {
		m.msgHost = h
	}
	var err error
	if m.tpl, err = loadTemplates(cfg.TemplateDir); err != nil {
		return nil, err
	}
	if cfg.From != "" {
		a, err := mail.ParseAddress(cfg.From)
		if err != nil || !strings.Contains(a.Address, "@") {
			return nil, fmt.Errorf("%w: sender address (BULWARK_EMAIL_FROM) is malformed", ErrInvalidConfig)
		}
		m.from = a.String()
	}
	if cfg.SMTP != nil {
		if m.from == "" {
			return nil, fmt.Errorf("%w: a sender address (BULWARK_EMAIL_FROM) is required with SMTP", ErrInvalidConfig)
		}
		if m.client, err = newClient(cfg.SMTP, cfg.TLSConfig, cfg.SendTimeout, m.msgHost); err != nil {
			return nil, err
		}
	}
	if m.metrics, err = newMetrics(m, cfg.Registerer); err != nil {
		return nil, err
	}
	if m.client == nil {
		m.log.Warn("no SMTP server configured: mail is held in the outbox (codes readable with PendingTokens)")
	} else {
		m.log.Info("mail goes out through SMTP", "smtp", cfg.SMTP, "from", m.from)
	}
	return m, nil
}

// newClient builds the go-mail client for c. Nothing is dialled yet.
func newClient(c *SMTPConfig, base *tls.Config, timeout time.Duration, helo string) (*gomail.Client, error) {
	// A hand-built SMTPConfig gets the checks ParseSMTPURL makes.
	switch {
	case c.Host == "" || c.Port < 1 || c.Port > 65535:
		return nil, fmt.Errorf("%w: host and port 1-65535 required", ErrInvalidSMTPURL)
	case c.TLS == TLSNone && !isLoopback(c.Host):
		return nil, fmt.Errorf("%w: tls=none is only allowed to a loopback address", ErrInvalidSMTPURL)
	case c.Username != "" && c.password == "":
		return nil, fmt.Errorf("%w: a user without a password (build the config with ParseSMTPURL)", ErrInvalidSMTPURL)
	}
	tc := &tls.Config{}
	if base != nil {
		tc = base.Clone()
	}
	if tc.ServerName == "" {
		tc.ServerName = c.Host
	}
	if tc.MinVersion == 0 {
		tc.MinVersion = tls.VersionTLS12
	}
	opts := []gomail.Option{gomail.WithPort(c.Port), gomail.WithTimeout(timeout), gomail.WithTLSConfig(tc)}
	if helo != "" {
		opts = append(opts, gomail.WithHELO(helo))
	}
	switch c.TLS {
	case TLSImplicit:
		opts = append(opts, gomail.WithSSL())
	case TLSStartTLS:
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	case TLSNone:
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	default:
		return nil, fmt.Errorf("%w: unknown TLS mode %q", ErrInvalidSMTPURL, c.TLS)
	}
	if c.Username != "" {
		// Over TLS the strongest mechanism the server offers; in plain text
		// (loopback only) PLAIN, which go-mail allows only to localhost.
		auth := gomail.SMTPAuthAutoDiscover
		if c.TLS == TLSNone {
			auth = gomail.SMTPAuthPlain
		}
		opts = append(opts, gomail.WithSMTPAuth(auth), gomail.WithUsername(c.Username), gomail.WithPassword(c.password))
	}
	client, err := gomail.NewClient(c.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSMTPURL, err)
	}
	return client, nil
}

func (m *Mailer) now() time.Time { return m.cfg.Now() }

// Held reports whether the mailer has no SMTP server and holds all mail.
func (m *Mailer) Held() bool { return m.client == nil }

// Wake makes a running worker look for due mail now. It never blocks.
func (m *Mailer) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Start runs Run in the background until Stop or the end of ctx. Any
// number of nodes may run a worker over the same database.
func (m *Mailer) Start(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.stop != nil {
		return errors.New("email: worker already started")
	}
	ctx, cancel := context.WithCancel(ctx)
	m.stop, m.done = cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		_ = m.Run(ctx)
	}()
	return nil
}

// Stop ends a worker started with Start and waits for it (a mail being
// sent finishes first, within SendTimeout), or until ctx ends.
func (m *Mailer) Stop(ctx context.Context) error {
	m.runMu.Lock()
	stop, done := m.stop, m.done
	m.stop, m.done = nil, nil
	m.runMu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run sends due mail until ctx ends: at once, on every NOTIFY from Enqueue
// in any process, on Wake, and every PollInterval (for retries that fall
// due). It also cancels mail whose code expired and prunes old rows.
// Without SMTP it only does the latter.
func (m *Mailer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if m.client != nil {
		wg.Go(func() { m.listen(ctx) })
	}
	tick := time.NewTicker(m.cfg.PollInterval)
	defer tick.Stop()
	for {
		if _, err := m.Deliver(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("delivering mail", "err", err)
		}
		if now := m.now(); now.Sub(m.lastPrune) >= pruneEvery {
			if _, err := m.Prune(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("pruning the outbox", "err", err)
			} else {
				m.lastPrune = now
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		case <-tick.C:
		}
	}
}

// listen wakes the worker on every NOTIFY, over a connection of its own.
func (m *Mailer) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := m.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		m.log.Warn("listening for queued mail; reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (m *Mailer) listenOnce(ctx context.Context) error {
	sessions := m.cfg.Sessions
	if sessions == nil {
		sessions = m.pool
	}
	conn, err := sessions.Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTEN needs its session for good: it never returns to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, qListenEmail); err != nil {
		return err
	}
	// Whatever was queued before the LISTEN took effect is found now.
	m.Wake()
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		m.Wake()
	}
}
