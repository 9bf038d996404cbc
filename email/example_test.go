package email_test

import (
	"context"
	"log/slog"
	"os"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/email"
)

// How a server wires the package: parse the settings, start the worker,
// and send a code inside the request's transaction.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("BULWARK_DATABASE_URL"))
	if err != nil {
		return
	}
	cfg := email.Config{
		From:       os.Getenv("BULWARK_EMAIL_FROM"),
		Hostname:   "pds.example.com",
		Registerer: prometheus.NewRegistry(), // metrics.Registry in Bulwark
		Logger:     slog.Default(),
	}
	if raw := os.Getenv("BULWARK_SMTP_URL"); raw != "" {
		if cfg.SMTP, err = email.ParseSMTPURL(raw); err != nil {
			return // a start-up error naming BULWARK_SMTP_URL
		}
	}
	mailer, err := email.New(pool, cfg)
	if err != nil {
		return
	}
	if err := mailer.Start(ctx); err != nil {
		return
	}
	defer func() { _ = mailer.Stop(ctx) }()

	// com.atproto.server.requestEmailConfirmation:
	did := syntax.DID("did:plc:ewvi7nxzyoun6zhxrhs64oiz")
	tx, err := pool.Begin(ctx)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := mailer.SendToken(ctx, tx, did, "alice@example.com", email.PurposeConfirmEmail,
		email.TokenData{Handle: "alice.pds.example.com"}); err != nil {
		return
	}
	_ = tx.Commit(ctx)

	// com.atproto.server.confirmEmail, later, in its own transaction:
	//	err := mailer.Consume(ctx, tx, did, email.PurposeConfirmEmail, input.Token)
	//	errors.Is(err, email.ErrTokenInvalid) → 400 InvalidToken
	//	errors.Is(err, email.ErrTokenExpired) → 400 ExpiredToken
}
