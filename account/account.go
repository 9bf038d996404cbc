package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/repo"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qInsertAccount              = queries.MustGet("InsertAccount")
	qHandleOrEmailTaken         = queries.MustGet("HandleOrEmailTaken")
	qGetAccountByDID            = queries.MustGet("GetAccountByDID")
	qGetAccountByHandle         = queries.MustGet("GetAccountByHandle")
	qGetAccountByEmail          = queries.MustGet("GetAccountByEmail")
	qLockAccount                = queries.MustGet("LockAccount")
	qGetSigningKey              = queries.MustGet("GetSigningKey")
	qSetStatus                  = queries.MustGet("SetStatus")
	qSetHandle                  = queries.MustGet("SetHandle")
	qDeleteAccount              = queries.MustGet("DeleteAccount")
	qCheckSession               = queries.MustGet("CheckSession")
	qCheckSessionGuard          = queries.MustGet("CheckSessionGuard")
	qInsertRefreshToken         = queries.MustGet("InsertRefreshToken")
	qInsertTakendownSession     = queries.MustGet("InsertTakendownSession")
	qLockRefreshToken           = queries.MustGet("LockRefreshToken")
	qRotateRefreshToken         = queries.MustGet("RotateRefreshToken")
	qRefreshTokenExpiry         = queries.MustGet("RefreshTokenExpiry")
	qDeleteRefreshToken         = queries.MustGet("DeleteRefreshToken")
	qDeleteSession              = queries.MustGet("DeleteSession")
	qDeleteExpiredRefreshTokens = queries.MustGet("DeleteExpiredRefreshTokens")
	qInsertAppPassword          = queries.MustGet("InsertAppPassword")
	qCountAppPasswords          = queries.MustGet("CountAppPasswords")
	qFindAppPassword            = queries.MustGet("FindAppPassword")
	qListAppPasswords           = queries.MustGet("ListAppPasswords")
	qDeleteAppPassword          = queries.MustGet("DeleteAppPassword")
	qDeleteAppPasswordSessions  = queries.MustGet("DeleteAppPasswordSessions")
	qInsertInviteCode           = queries.MustGet("InsertInviteCode")
	qUseInviteCode              = queries.MustGet("UseInviteCode")
	qInsertInviteUse            = queries.MustGet("InsertInviteUse")
	qListInviteCodesFor         = queries.MustGet("ListInviteCodesFor")
	qSessionOfRefreshToken      = queries.MustGet("SessionOfRefreshToken")
	qLockRepoRoot               = queries.MustGet("LockRepoRoot")
	qSetPassword                = queries.MustGet("SetPassword")
	qDeleteAllSessions          = queries.MustGet("DeleteAllSessions")
	qSetInvitesDisabled         = queries.MustGet("SetInvitesDisabled")
	qGetAccountsByDID           = queries.MustGet("GetAccountsByDID")
	qInviteUsedBy               = queries.MustGet("InviteUsedBy")
	qListInviteCodes            = queries.MustGet("ListInviteCodes")
	qDisableInviteCodes         = queries.MustGet("DisableInviteCodes")
	qCountCredentials           = queries.MustGet("CountCredentials")
)

// Status is an account's hosting status.
type Status string

// Account statuses. StatusDeleted is never stored (a deleted account's row
// is removed); it appears in #account events and in lookups' errors.
const (
	StatusActive      Status = "active"
	StatusDeactivated Status = "deactivated"
	StatusTakendown   Status = "takendown"
	StatusDeleted     Status = "deleted"
)

// Account is a hosted account.
type Account struct {
	DID             syntax.DID
	Handle          syntax.Handle
	Email           string
	Status          Status
	InvitesDisabled bool
	CreatedAt       time.Time
	// EmailConfirmedAt is when Email was confirmed (confirmEmail); nil
	// while it is not.
	EmailConfirmedAt *time.Time
	// EmailAuthFactor is whether a password login also needs a code
	// mailed to Email (updateEmail's emailAuthFactor).
	EmailAuthFactor bool

	passwordHash string
}

// Active reports whether the account's repository is served and writable.
func (a *Account) Active() bool { return a.Status == StatusActive }

// Config is what New needs.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Keys stores signing keys. Required.
	Keys *KeyStore
	// Repo creates the empty repository of a new account. Required.
	Repo *repo.Engine
	// PLC creates and updates DIDs. Required.
	PLC *plc.Client
	// Waker is told when events were committed (the firehose sequencer).
	// May be nil.
	Waker repo.Waker
	// HandleDomains are the suffixes (each starting with '.') users may
	// register handles under. Required.
	HandleDomains []string
	// InviteRequired makes CreateAccount require an invite code.
	InviteRequired bool
	// PublicURL is the server's base URL, written into DID documents as
	// the atproto_pds endpoint. Required.
	PublicURL string
	// ServiceDID is the audience of session tokens. Required.
	ServiceDID string
	// JWTSecret signs session tokens. Required (32 bytes or more).
	JWTSecret []byte
	// Password are argon2id's costs; zero means DefaultPasswordParams.
	// Tests lower them; production should not.
	Password PasswordParams
	// PasswordHashes bounds the password hashes computed at once; more
	// wait their turn in a FIFO queue of PasswordQueue places, for at most
	// PasswordWait, and fail with ErrPasswordBusy past either. Zero means
	// DefaultPasswordHashes(), DefaultPasswordQueue (negative: no queue)
	// and DefaultPasswordWait.
	PasswordHashes int
	PasswordQueue  int
	PasswordWait   time.Duration
	// PasswordSlots, when set, are the hash slots and their queue in place
	// of those PasswordHashes and PasswordQueue describe (NewPasswordSlots
	// builds them): a server passes its own to report them in metrics.
	PasswordSlots *budget.Budget
	// AccessTTL and RefreshTTL override the token lifetimes (tests).
	AccessTTL, RefreshTTL time.Duration
	// Now overrides the clock for tokens (tests).
	Now func() time.Time
	// Cleaners remove what other packages keep for an account (blob
	// references, ...) inside the account's deletion transaction.
	Cleaners []Cleaner
	// SessionEnders end the sessions other packages keep for an account
	// (OAuth grants) inside the transaction that ends the account's own:
	// a takedown and a password reset.
	SessionEnders []SessionEnder
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Mail issues the mailed codes (confirm an address, reset a password,
	// delete the account, sign a PLC operation) and queues mail in the
	// outbox. Nil means a Mailer without SMTP, which holds every mail for
	// an operator to read (email.Mailer.PendingTokens).
	Mail *email.Mailer
}

// Cleaner deletes what a package keeps for an account, inside the
// transaction that deletes the account; an error aborts the deletion.
type Cleaner interface {
	DeleteAccountTx(ctx context.Context, tx db.DBTX, did syntax.DID) error
}

// SessionEnder ends every session another package keeps for did, inside
// tx; an error aborts the change that ends them.
type SessionEnder func(ctx context.Context, tx db.DBTX, did syntax.DID) error

// Service manages accounts and sessions.
type Service struct {
	cfg  Config
	pool *pgxpool.Pool
	keys *KeyStore
	repo *repo.Engine
	plc  *plc.Client
	hash *hasher
	// plcSlots bound the transactions waiting for the PLC directory.
	plcSlots *budget.Budget
	tokens   *signer
	mail     *email.Mailer
	log      *slog.Logger
}

// New returns an account service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Pool == nil, cfg.Keys == nil, cfg.Repo == nil, cfg.PLC == nil:
		return nil, errors.New("account: Pool, Keys, Repo and PLC are required")
	case len(cfg.HandleDomains) == 0:
		return nil, errors.New("account: no handle domains")
	case cfg.PublicURL == "" || cfg.ServiceDID == "":
		return nil, errors.New("account: PublicURL and ServiceDID are required")
	case len(cfg.JWTSecret) < 32:
		return nil, errors.New("account: JWT secret must be at least 32 bytes")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AccessTTL <= 0 {
		cfg.AccessTTL = AccessTokenTTL
	}
	if cfg.RefreshTTL <= 0 {
		cfg.RefreshTTL = RefreshTokenTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for i, d := range cfg.HandleDomains {
		cfg.HandleDomains[i] = strings.ToLower(d)
	}
	if cfg.Mail == nil {
		m, err := email.New(cfg.Pool, email.Config{Hostname: hostOf(cfg.PublicURL), Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("account: mailer: %w", err)
		}
		cfg.Mail = m
	}
	return &Service{
		cfg:      cfg,
		pool:     cfg.Pool,
		keys:     cfg.Keys,
		repo:     cfg.Repo,
		plc:      cfg.PLC,
		hash:     newHasher(cfg.Password, passwordSlots(cfg), cfg.PasswordWait),
		plcSlots: newPLCSlots(cfg.Pool),
		tokens: &signer{
			secret: cfg.JWTSecret, audience: cfg.ServiceDID,
			accessTTL: cfg.AccessTTL, refreshTTL: cfg.RefreshTTL, now: cfg.Now,
		},
		mail: cfg.Mail,
		log:  cfg.Logger.With("component", "account"),
	}, nil
}

func passwordSlots(cfg Config) *budget.Budget {
	if cfg.PasswordSlots != nil {
		return cfg.PasswordSlots
	}
	return NewPasswordSlots(cfg.PasswordHashes, cfg.PasswordQueue)
}

// PasswordSlots are the password-hash slots and their queue, for metrics.
func (s *Service) PasswordSlots() *budget.Budget { return s.hash.slots }

// HandleDomains are the domains users may register handles under.
func (s *Service) HandleDomains() []string { return s.cfg.HandleDomains }

func (s *Service) wake() {
	if s.cfg.Waker != nil {
		s.cfg.Waker.Wake()
	}
}

// Get returns the account with did.
func (s *Service) Get(ctx context.Context, did syntax.DID) (*Account, error) {
	return s.scanAccount(s.pool.QueryRow(ctx, qGetAccountByDID, did.String()))
}

// GetByHandle returns the account with handle (any case).
func (s *Service) GetByHandle(ctx context.Context, handle syntax.Handle) (*Account, error) {
	return s.scanAccount(s.pool.QueryRow(ctx, qGetAccountByHandle, handle.Normalize().String()))
}

// Lookup finds an account by DID, handle or email, as a login identifier
// may be any of the three.
func (s *Service) Lookup(ctx context.Context, identifier string) (*Account, error) {
	identifier = strings.TrimSpace(identifier)
	switch {
	case strings.HasPrefix(identifier, "did:"):
		did, err := syntax.ParseDID(identifier)
		if err != nil {
			return nil, ErrAccountNotFound
		}
		return s.Get(ctx, did)
	case strings.Contains(identifier, "@"):
		return s.scanAccount(s.pool.QueryRow(ctx, qGetAccountByEmail, strings.ToLower(identifier)))
	default:
		h, err := syntax.ParseHandle(strings.TrimPrefix(identifier, "@"))
		if err != nil {
			return nil, ErrAccountNotFound
		}
		return s.GetByHandle(ctx, h)
	}
}

// row is one result row: a pgx.Row, or the current row of pgx.Rows.
type row interface {
	Scan(dest ...any) error
}

func (s *Service) scanAccount(r row) (*Account, error) {
	var a Account
	var did, handle, status string
	err := db.Translate(r.Scan(&did, &handle, &a.Email, &status, &a.InvitesDisabled, &a.CreatedAt, &a.passwordHash, &a.EmailConfirmedAt, &a.EmailAuthFactor))
	if errors.Is(err, db.ErrNotFound) {
		return nil, ErrAccountNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading account: %w", err)
	}
	a.DID, a.Handle, a.Status = syntax.DID(did), syntax.Handle(handle), Status(status)
	return &a, nil
}

// Status returns did's status: StatusDeleted (with ErrAccountNotFound) when
// no account has it.
func (s *Service) Status(ctx context.Context, did syntax.DID) (Status, error) {
	a, err := s.Get(ctx, did)
	if errors.Is(err, ErrAccountNotFound) {
		return StatusDeleted, err
	}
	if err != nil {
		return "", err
	}
	return a.Status, nil
}

// PublicKey returns did's repository signing key's public half (for DID
// documents and getRecommendedDidCredentials).
func (s *Service) PublicKey(ctx context.Context, did syntax.DID) (atcrypto.PublicKey, error) {
	key, err := s.keys.SigningKey(ctx, did)
	if err != nil {
		return nil, err
	}
	return key.PublicKey()
}

// RotationKey is the server's PLC rotation key as a did:key.
func (s *Service) RotationKey() string { return s.plc.RotationKey() }
