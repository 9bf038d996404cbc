package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// newMailer builds the Mailer of cfg over pool's outbox, its metrics in
// the metrics registry, the mail to one address limited by limits'
// mailRecipient policy (nil: no limit). Without --smtp-url every mail is
// held and the codes are read with `bulwark admin account tokens`. The
// caller runs its worker (Mailer.Run) beside the server.
func newMailer(cfg *config.Config, pool, sessions *pgxpool.Pool, limits *ratelimit.Set, logger *slog.Logger) (*email.Mailer, error) {
	smtp, err := cfg.SMTP()
	if err != nil {
		return nil, err
	}
	m, err := email.New(pool, email.Config{
		SMTP:        smtp,
		From:        cfg.EmailFrom,
		Hostname:    cfg.Hostname,
		TemplateDir: cfg.EmailTemplates,
		// The server's limiter: its metrics and pruning come with the set.
		RecipientLimit: limits.Get(ratelimit.PolicyMailRecipient),
		Sessions:       sessions,
		Registerer:     replacingRegisterer{metrics.Registry},
		Logger:         logger,
	})
	if err != nil {
		return nil, fmt.Errorf("email: %w", err)
	}
	if m.Held() {
		logger.Info("codes users ask for (email confirmation, password reset, account deletion, PLC operations) wait for the operator: read them with `bulwark admin account tokens HANDLE`, or set --smtp-url")
	}
	return m, nil
}

// replacingRegisterer registers collectors, replacing one registered
// earlier with the same metrics, as the metrics package's Register*
// functions do: a process that builds a second server (tests do) reports
// the newest.
type replacingRegisterer struct{ prometheus.Registerer }

// Register implements prometheus.Registerer.
func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		r.Registerer.Unregister(already.ExistingCollector)
		return r.Registerer.Register(c)
	}
	return err
}

// MustRegister implements prometheus.Registerer.
func (r replacingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}
