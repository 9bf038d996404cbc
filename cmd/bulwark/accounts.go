package main

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// newAccountStack builds the repository engine, the account service and
// the signing-key store they share over pool. waker (the firehose sequencer) may be nil. The signing-key
// store is sealed with a key derived from the PLC rotation key (see
// account.KeyStore for why that secret). cleaners run inside every account
// deletion (the blob service's references, ...). plcHTTP carries the PLC
// client's requests; nil means an ordinary client (the development PLC
// passes its in-process one). The account service's Mailer (newMailer,
// its mail per address under limits' mailRecipient policy; nil limits:
// none) is built here too; the caller runs its worker.
func newAccountStack(cfg *config.Config, pool *pgxpool.Pool, waker repo.Waker, repoCfg repo.Config, plcHTTP *http.Client, limits *ratelimit.Set, logger *slog.Logger, cleaners ...account.Cleaner) (*account.Service, *repo.Engine, *account.KeyStore, error) {
	rotation, err := cfg.PLCRotationPrivateKey()
	if err != nil {
		return nil, nil, nil, err
	}
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	if err != nil {
		return nil, nil, nil, err
	}
	if repoCfg.Logger == nil {
		repoCfg.Logger = logger
	}
	engine := repo.New(pool, keys, waker, repoCfg)
	plcClient, err := plc.NewClient(cfg.PLCURL, rotation, plcHTTP)
	if err != nil {
		return nil, nil, nil, err
	}
	mailer, err := newMailer(cfg, pool, repoCfg.Sessions, limits, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	queue := cfg.PasswordQueue
	if queue == 0 {
		queue = -1 // NewPasswordSlots: negative is "no queue"
	}
	slots := account.NewPasswordSlots(0, queue)
	metrics.RegisterPasswordSlots(func() metrics.BudgetStats { return metrics.BudgetStats(slots.Stats()) })
	accounts, err := account.New(account.Config{
		Pool:           pool,
		Keys:           keys,
		Repo:           engine,
		PLC:            plcClient,
		Waker:          waker,
		HandleDomains:  cfg.HandleDomains,
		InviteRequired: cfg.InviteRequired,
		PublicURL:      cfg.PublicURL(),
		ServiceDID:     cfg.ServiceDID(),
		JWTSecret:      []byte(cfg.JWTSecret),
		PasswordSlots:  slots,
		PasswordWait:   cfg.PasswordWait,
		Cleaners:       cleaners,
		Logger:         logger,
		Mail:           mailer,
		// A takedown or a password change ends the account's OAuth
		// grants with its sessions; deleting the account deletes them.
		SessionEnders: []account.SessionEnder{oauth.RevokeAllGrants},
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("accounts: %w", err)
	}
	return accounts, engine, keys, nil
}
