package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
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
	qSetEmail                   = queries.MustGet("SetEmail")
	qSetInvitesDisabled         = queries.MustGet("SetInvitesDisabled")
	qGetAccountsByDID           = queries.MustGet("GetAccountsByDID")
	qInviteUsedBy               = queries.MustGet("InviteUsedBy")
	qListInviteCodes            = queries.MustGet("ListInviteCodes")
	qDisableInviteCodes         = queries.MustGet("DisableInviteCodes")
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
	// AccessTTL and RefreshTTL override the token lifetimes (tests).
	AccessTTL, RefreshTTL time.Duration
	// Now overrides the clock for tokens (tests).
	Now func() time.Time
	// Cleaners remove what other packages keep for an account (blob
	// references, ...) inside the account's deletion transaction.
	Cleaners []Cleaner
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Cleaner deletes what a package keeps for an account, inside the
// transaction that deletes the account; an error aborts the deletion.
type Cleaner interface {
	DeleteAccountTx(ctx context.Context, tx pgx.Tx, did syntax.DID) error
}

// Service manages accounts and sessions.
type Service struct {
	cfg    Config
	pool   *pgxpool.Pool
	keys   *KeyStore
	repo   *repo.Engine
	plc    *plc.Client
	hash   *hasher
	tokens *signer
	log    *slog.Logger
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
	return &Service{
		cfg:  cfg,
		pool: cfg.Pool,
		keys: cfg.Keys,
		repo: cfg.Repo,
		plc:  cfg.PLC,
		hash: newHasher(cfg.Password),
		tokens: &signer{
			secret: cfg.JWTSecret, audience: cfg.ServiceDID,
			accessTTL: cfg.AccessTTL, refreshTTL: cfg.RefreshTTL, now: cfg.Now,
		},
		log: cfg.Logger.With("component", "account"),
	}, nil
}

// HandleDomains are the domains users may register handles under.
func (s *Service) HandleDomains() []string { return s.cfg.HandleDomains }

// CreateInput is what createAccount asks for.
type CreateInput struct {
	Handle     string
	Email      string
	Password   string
	InviteCode string
	// DID, when set, asks to bring an existing DID: not supported yet.
	DID string
}

func normalizeEmail(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", ruleErr(ErrInvalidEmail, "email is required")
	}
	a, err := mail.ParseAddress(raw)
	if err != nil || a.Address != raw || !strings.Contains(raw, "@") || len(raw) > 254 {
		return "", ruleErr(ErrInvalidEmail, "%q is not a valid email address", raw)
	}
	return strings.ToLower(raw), nil
}

// CreateAccount creates an account with a new did:plc, its empty
// repository, and a session.
//
// Order of events: everything that can be checked locally is checked
// first; then one transaction inserts the account (the unique indexes
// settle races on handle and email), uses the invite, writes the genesis
// commit and the #identity, #account and #sync events, and the session;
// the PLC genesis is submitted while that transaction is still open, and
// the transaction commits only if the directory accepted it. A PLC failure
// therefore leaves nothing behind. The reverse failure (PLC accepted, then
// the commit failed) leaves a DID pointing here with no account: it is
// logged and tombstoned on a best-effort basis.
func (s *Service) CreateAccount(ctx context.Context, in CreateInput) (*Account, *Session, error) {
	if in.DID != "" {
		return nil, nil, ruleErr(ErrUnsupportedDID, "bringing an existing DID (%s) is not supported yet; create the account without \"did\"", in.DID)
	}
	handle, err := s.NormalizeHandle(in.Handle)
	if err != nil {
		return nil, nil, err
	}
	email, err := normalizeEmail(in.Email)
	if err != nil {
		return nil, nil, err
	}
	if err := checkNewPassword(in.Password); err != nil {
		return nil, nil, err
	}
	invite := strings.TrimSpace(in.InviteCode)
	if s.cfg.InviteRequired && invite == "" {
		return nil, nil, ruleErr(ErrInvalidInviteCode, "an invite code is required to create an account here")
	}
	var handleTaken, emailTaken bool
	if err := s.pool.QueryRow(ctx, qHandleOrEmailTaken, handle.String(), email).Scan(&handleTaken, &emailTaken); err != nil {
		return nil, nil, fmt.Errorf("checking handle: %w", db.Translate(err))
	}
	if handleTaken {
		return nil, nil, ruleErr(ErrHandleNotAvailable, "handle %s is already taken", handle)
	}
	if emailTaken {
		return nil, nil, ruleErr(ErrEmailTaken, "email %s is already used by another account", email)
	}

	pwHash, err := s.hash.hash(ctx, in.Password)
	if err != nil {
		return nil, nil, err
	}
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return nil, nil, err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return nil, nil, err
	}
	did, genesis, err := s.plc.Genesis(plc.Identity{Handle: handle, SigningKey: pub, PDSEndpoint: s.cfg.PublicURL})
	if err != nil {
		return nil, nil, err
	}
	sealed, err := s.keys.seal(did, key)
	if err != nil {
		return nil, nil, err
	}
	log := s.log.With("did", did, "handle", handle)

	var sess *Session
	submitted := false
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qInsertAccount, did.String(), handle.String(), email, pwHash, sealed); err != nil {
			return uniqueViolation(err, handle, email)
		}
		if invite != "" {
			if err := useInvite(ctx, tx, invite, did); err != nil {
				return err
			}
		}
		head, err := s.repo.InitRepo(ctx, tx, did, key)
		if err != nil {
			return err
		}
		if err := appendIdentity(ctx, tx, did, handle); err != nil {
			return err
		}
		if err := appendAccount(ctx, tx, did, StatusActive); err != nil {
			return err
		}
		ev, err := s.repo.SyncEvent(ctx, tx, did)
		if err != nil {
			return err
		}
		if err := eventlog.Append(ctx, tx, ev); err != nil {
			return err
		}
		sess, err = s.newSession(ctx, tx, did, nil)
		if err != nil {
			return err
		}
		if err := s.plc.Submit(ctx, did, genesis); err != nil {
			return err
		}
		submitted = true
		log.Debug("plc genesis accepted", "rev", head.Rev)
		return nil
	})
	if err != nil {
		if submitted {
			log.Error("account not stored after its DID was created in the PLC directory; tombstoning the DID", "error", err)
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), plc.DefaultTimeout)
			defer cancel()
			if terr := s.plc.Tombstone(tctx, did, genesis); terr != nil {
				log.Error("could not tombstone orphaned DID", "error", terr)
			}
		}
		return nil, nil, err
	}
	s.keys.remember(did, key)
	s.wake()
	log.Info("account created")
	return &Account{DID: did, Handle: handle, Email: email, Status: StatusActive, CreatedAt: time.Now()}, sess, nil
}

func (s *Service) wake() {
	if s.cfg.Waker != nil {
		s.cfg.Waker.Wake()
	}
}

// uniqueViolation turns a unique-index failure on insert into the error
// naming what is taken.
func uniqueViolation(err error, handle syntax.Handle, email string) error {
	err = db.Translate(err)
	if !errors.Is(err, db.ErrConflict) {
		return fmt.Errorf("storing account: %w", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.Contains(pgErr.ConstraintName, "email") {
		return ruleErr(ErrEmailTaken, "email %s is already used by another account", email)
	}
	return ruleErr(ErrHandleNotAvailable, "handle %s is already taken", handle)
}

func appendIdentity(ctx context.Context, tx pgx.Tx, did syntax.DID, handle syntax.Handle) error {
	h := handle.String()
	ev, err := eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: did.String(), Handle: &h, Time: syntax.DatetimeNow().String()})
	if err != nil {
		return err
	}
	return eventlog.Append(ctx, tx, ev)
}

func appendAccount(ctx context.Context, tx pgx.Tx, did syntax.DID, status Status) error {
	ev := &comatproto.SyncSubscribeRepos_Account{Did: did.String(), Active: status == StatusActive, Time: syntax.DatetimeNow().String()}
	if status != StatusActive {
		st := string(status)
		ev.Status = &st
	}
	enc, err := eventlog.EncodeAccount(ev)
	if err != nil {
		return err
	}
	return eventlog.Append(ctx, tx, enc)
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

func (s *Service) scanAccount(row pgx.Row) (*Account, error) {
	var a Account
	var did, handle, status string
	err := row.Scan(&did, &handle, &a.Email, &status, &a.InvitesDisabled, &a.CreatedAt, &a.passwordHash)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrAccountNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading account: %w", db.Translate(err))
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

// AppPasswordInfo names the app password a session was made with.
type AppPasswordInfo struct {
	Name       string
	Privileged bool
}

// Login checks identifier (DID, handle or email) and password (the account
// password or one of its app passwords). A taken-down account cannot log
// in; a deactivated one can (it needs a session to reactivate).
func (s *Service) Login(ctx context.Context, identifier, password string) (*Account, *AppPasswordInfo, error) {
	a, err := s.Lookup(ctx, identifier)
	if errors.Is(err, ErrAccountNotFound) {
		s.hash.dummyVerify(ctx, password)
		return nil, nil, ErrAuthFailed
	}
	if err != nil {
		return nil, nil, err
	}
	var app *AppPasswordInfo
	if looksLikeAppPassword(password) {
		app, err = s.findAppPassword(ctx, a.DID, password)
		if err != nil {
			return nil, nil, err
		}
	}
	if app == nil {
		ok, err := s.hash.verify(ctx, password, a.passwordHash)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			return nil, nil, ErrAuthFailed
		}
	}
	if a.Status == StatusTakendown {
		return nil, nil, ErrAccountTakendown
	}
	return a, app, nil
}

// CreateSession starts a session for did (after Login).
func (s *Service) CreateSession(ctx context.Context, did syntax.DID, app *AppPasswordInfo) (*Session, error) {
	var sess *Session
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Expired refresh rows are swept here, per account, rather than by
		// a background job.
		if _, err := tx.Exec(ctx, qDeleteExpiredRefreshTokens, did.String()); err != nil {
			return db.Translate(err)
		}
		var err error
		sess, err = s.newSession(ctx, tx, did, app)
		return err
	})
	return sess, err
}

func scopeFor(app *AppPasswordInfo) string {
	switch {
	case app == nil:
		return ScopeAccess
	case app.Privileged:
		return ScopeAppPassPrivileged
	default:
		return ScopeAppPass
	}
}

func (s *Service) newSession(ctx context.Context, tx pgx.Tx, did syntax.DID, app *AppPasswordInfo) (*Session, error) {
	sid, jti := randomID(), randomID()
	sess, exp, err := s.tokens.issue(did, scopeFor(app), sid, jti)
	if err != nil {
		return nil, err
	}
	var appName *string
	if app != nil {
		appName = &app.Name
	}
	if _, err := tx.Exec(ctx, qInsertRefreshToken, jti, sid, did.String(), appName, exp); err != nil {
		return nil, fmt.Errorf("storing session: %w", db.Translate(err))
	}
	return sess, nil
}

// RefreshGrace is how long an exchanged refresh token may be presented
// again (retries, concurrent refreshes, clients such as goat that keep the
// first token): it yields the same successor. The reference PDS allows 2 h.
const RefreshGrace = 2 * time.Hour

// Refresh exchanges a refresh token for a new pair (rotation: the
// presented token then works only for RefreshGrace, and only to get the
// same successor again).
func (s *Service) Refresh(ctx context.Context, refreshToken string) (*Account, *Session, error) {
	c, err := s.tokens.parse(refreshToken, typRefresh, ScopeRefresh)
	if err != nil {
		return nil, nil, err
	}
	a, err := s.Get(ctx, c.DID)
	if errors.Is(err, ErrAccountNotFound) {
		return nil, nil, ruleErr(ErrInvalidToken, "the account no longer exists")
	}
	if err != nil {
		return nil, nil, err
	}
	if a.Status == StatusTakendown {
		return nil, nil, ErrAccountTakendown
	}
	var sess *Session
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var sid string
		var appName, next *string
		var privileged bool
		err := tx.QueryRow(ctx, qLockRefreshToken, c.ID, c.DID.String()).Scan(&sid, &appName, &privileged, &next)
		if errors.Is(err, pgx.ErrNoRows) {
			return ruleErr(ErrInvalidToken, "refresh token has been revoked or has expired")
		}
		if err != nil {
			return db.Translate(err)
		}
		var app *AppPasswordInfo
		if appName != nil {
			app = &AppPasswordInfo{Name: *appName, Privileged: privileged}
		}
		if next != nil {
			// Presented again within the grace period: the same successor.
			var exp time.Time
			err := tx.QueryRow(ctx, qRefreshTokenExpiry, *next).Scan(&exp)
			if errors.Is(err, pgx.ErrNoRows) {
				return ruleErr(ErrInvalidToken, "refresh token has been revoked or has expired")
			}
			if err != nil {
				return db.Translate(err)
			}
			sess, err = s.tokens.issueWithExpiry(c.DID, scopeFor(app), sid, *next, exp)
			return err
		}
		jti := randomID()
		var exp time.Time
		sess, exp, err = s.tokens.issue(c.DID, scopeFor(app), sid, jti)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qRotateRefreshToken, c.ID, jti, s.cfg.Now().Add(RefreshGrace)); err != nil {
			return db.Translate(err)
		}
		_, err = tx.Exec(ctx, qInsertRefreshToken, jti, sid, c.DID.String(), appName, exp)
		return db.Translate(err)
	})
	if err != nil {
		return nil, nil, err
	}
	return a, sess, nil
}

// Logout ends the session a refresh token belongs to. Its access tokens
// stop working at once.
func (s *Service) Logout(ctx context.Context, refreshToken string) error {
	c, err := s.tokens.parse(refreshToken, typRefresh, ScopeRefresh)
	if err != nil {
		return err
	}
	var sid string
	err = s.pool.QueryRow(ctx, qSessionOfRefreshToken, c.ID, c.DID.String()).Scan(&sid)
	if errors.Is(err, pgx.ErrNoRows) {
		// Already ended: deleteSession is idempotent.
		return nil
	}
	if err != nil {
		return db.Translate(err)
	}
	_, err = s.pool.Exec(ctx, qDeleteSession, sid, c.DID.String())
	return db.Translate(err)
}

// Auth is an authenticated request's identity.
type Auth struct {
	DID       syntax.DID
	Handle    syntax.Handle
	Status    Status
	Scope     string
	SessionID string
}

// FullAccess reports whether the session was made with the account
// password (not an app password).
func (a *Auth) FullAccess() bool { return a.Scope == ScopeAccess }

// Privileged reports whether the session may use privileged methods (full
// access or a privileged app password).
func (a *Auth) Privileged() bool { return a.Scope == ScopeAccess || a.Scope == ScopeAppPassPrivileged }

// Authenticate verifies an access token: signature, type, audience,
// expiry, scope, and (one query) that its account exists and its session
// has not ended. Account status is reported, not judged: callers decide
// whether a deactivated account may proceed.
func (s *Service) Authenticate(ctx context.Context, accessToken string) (*Auth, error) {
	a, err := s.ParseAccess(accessToken)
	if err != nil {
		return nil, err
	}
	var handle, status string
	var live bool
	err = s.pool.QueryRow(ctx, qCheckSession, a.DID.String(), a.SessionID).Scan(&handle, &status, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ruleErr(ErrInvalidToken, "the account no longer exists")
	}
	if err != nil {
		return nil, fmt.Errorf("checking session: %w", db.Translate(err))
	}
	if !live {
		return nil, ruleErr(ErrInvalidToken, "the session has ended")
	}
	a.Handle, a.Status = syntax.Handle(handle), Status(status)
	return a, nil
}

// ParseAccess verifies an access token without the database: signature,
// type, audience, expiry, scope. The account's state and the session's
// liveness are not checked: the caller must run WriteGuard in the
// transaction it acts in (or call Authenticate instead). Handle and Status
// of the result are unset.
func (s *Service) ParseAccess(accessToken string) (*Auth, error) {
	c, err := s.tokens.parse(accessToken, typAccess, ScopeAccess, ScopeAppPass, ScopeAppPassPrivileged)
	if err != nil {
		return nil, err
	}
	return &Auth{DID: c.DID, Scope: c.Scope, SessionID: c.ID}, nil
}

// sessionRefused is the SQLSTATE the write guard raises
// (bulwark_refuse_session, migrations/00009).
const sessionRefused = "BW002"

// WriteGuard is the statement that, run first in a commit's transaction,
// aborts it unless a's account is active and a's session is alive: the
// check Authenticate makes, without a round trip of its own. A commit
// refused by it fails with an error for which IsSessionRefused is true.
func WriteGuard(a *Auth) *repo.Guard {
	return &repo.Guard{SQL: qCheckSessionGuard, Args: []any{a.DID.String(), a.SessionID}}
}

// IsSessionRefused reports whether err comes from a WriteGuard.
func IsSessionRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == sessionRefused
}

// CheckPassword reports whether password is did's account password (not
// an app password).
func (s *Service) CheckPassword(ctx context.Context, did syntax.DID, password string) error {
	a, err := s.Get(ctx, did)
	if err != nil {
		if errors.Is(err, ErrAccountNotFound) {
			s.hash.dummyVerify(ctx, password)
			return ErrAuthFailed
		}
		return err
	}
	ok, err := s.hash.verify(ctx, password, a.passwordHash)
	if err != nil {
		return err
	}
	if !ok {
		return ErrAuthFailed
	}
	return nil
}

// UpdateHandle changes did's handle: the PLC document first (inside the
// transaction, so a directory failure changes nothing), then the row and
// an #identity event.
func (s *Service) UpdateHandle(ctx context.Context, did syntax.DID, raw string, opts ...WriteOption) (syntax.Handle, error) {
	handle, err := s.NormalizeHandle(raw)
	if err != nil {
		return "", err
	}
	submitted := false
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var cur, status, pw string
		err := tx.QueryRow(ctx, qLockAccount, did.String()).Scan(&cur, &status, &pw)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		}
		if err != nil {
			return db.Translate(err)
		}
		if cur != handle.String() {
			if _, err := tx.Exec(ctx, qSetHandle, did.String(), handle.String()); err != nil {
				return uniqueViolation(err, handle, "")
			}
			if err := s.plc.UpdateHandle(ctx, did, handle); err != nil {
				return err
			}
			submitted = true
		}
		// An unchanged handle still emits #identity: clients call
		// updateHandle to make relays re-verify a handle.
		if err := appendIdentity(ctx, tx, did, handle); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
	if err != nil {
		if submitted {
			// Rare (the commit failed after the directory accepted): the
			// DID document names the new handle, this database the old
			// one. Calling updateHandle again with the new handle repairs it.
			s.log.Error("handle changed in the PLC directory but not stored", "did", did, "handle", handle, "error", err)
		}
		return "", err
	}
	s.wake()
	s.log.Info("handle updated", "did", did, "handle", handle)
	return handle, nil
}

// SetStatus moves did between active, deactivated and takendown, and
// emits #account (plus #identity and #sync on reactivation, so consumers
// re-fetch what they may have dropped, as the reference PDS does).
func (s *Service) SetStatus(ctx context.Context, did syntax.DID, to Status, opts ...WriteOption) error {
	if to != StatusActive && to != StatusDeactivated && to != StatusTakendown {
		return fmt.Errorf("account: cannot set status %q", to)
	}
	changed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var handle, status, pw string
		err := tx.QueryRow(ctx, qLockAccount, did.String()).Scan(&handle, &status, &pw)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		}
		if err != nil {
			return db.Translate(err)
		}
		if Status(status) == to {
			return runAlso(ctx, tx, opts)
		}
		if _, err := tx.Exec(ctx, qSetStatus, did.String(), string(to)); err != nil {
			return db.Translate(err)
		}
		changed = true
		if to == StatusActive {
			if err := appendIdentity(ctx, tx, did, syntax.Handle(handle)); err != nil {
				return err
			}
		}
		if err := appendAccount(ctx, tx, did, to); err != nil {
			return err
		}
		if to == StatusActive {
			ev, err := s.repo.SyncEvent(ctx, tx, did)
			if err != nil {
				return err
			}
			if err := eventlog.Append(ctx, tx, ev); err != nil {
				return err
			}
		}
		return runAlso(ctx, tx, opts)
	})
	if err != nil {
		return err
	}
	if changed {
		s.wake()
		s.log.Info("account status changed", "did", did, "status", to)
	}
	return nil
}

// Delete removes did's account and repository for good, emitting #account
// with status deleted. Earlier events of the account stay in the log until
// they age out, as on any PDS; the #account event tells consumers to drop
// them.
func (s *Service) Delete(ctx context.Context, did syntax.DID, opts ...WriteOption) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var handle, status, pw string
		err := tx.QueryRow(ctx, qLockAccount, did.String()).Scan(&handle, &status, &pw)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		}
		if err != nil {
			return db.Translate(err)
		}
		// The repo row is locked first, as writers lock it, so a commit in
		// flight finishes before its rows are deleted.
		if _, err := tx.Exec(ctx, qLockRepoRoot, did.String()); err != nil {
			return db.Translate(err)
		}
		for _, c := range s.cfg.Cleaners {
			if err := c.DeleteAccountTx(ctx, tx, did); err != nil {
				return fmt.Errorf("deleting account: %w", err)
			}
		}
		if err := s.cfg.Repo.DeleteRepoTx(ctx, tx, did); err != nil {
			return fmt.Errorf("deleting account: %w", err)
		}
		if _, err := tx.Exec(ctx, qDeleteAccount, did.String()); err != nil {
			return fmt.Errorf("deleting account: %w", db.Translate(err))
		}
		if err := appendAccount(ctx, tx, did, StatusDeleted); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
	if err != nil {
		return err
	}
	s.keys.forget(did)
	s.wake()
	s.log.Info("account deleted", "did", did)
	return nil
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
