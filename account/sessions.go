package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/repo"
)

// Sessions: logging in, refresh-token rotation, logging out, and checking
// access tokens (in a query of their own, or as a guard statement inside a
// write's transaction).

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
	if err != nil && !errors.Is(err, ErrAccountNotFound) {
		return nil, nil, err
	}
	return s.LoginAccount(ctx, a, password)
}

// LoginAccount is Login for an account already looked up (Lookup), so that
// a caller can apply the account's login limit before the password is
// hashed. a is nil when no account has the identifier: the check then
// takes as long as a wrong password and fails with ErrAuthFailed. With
// every hash slot taken it waits its turn, and fails with ErrPasswordBusy
// when the queue is full or the wait runs out. A taken-down account is
// ErrAccountTakendown once its password checked out (LoginTakendown lets
// it in).
func (s *Service) LoginAccount(ctx context.Context, a *Account, password string) (*Account, *AppPasswordInfo, error) {
	a, app, err := s.checkLogin(ctx, a, password)
	if err != nil {
		return nil, nil, err
	}
	if a.Status == StatusTakendown {
		return nil, nil, ErrAccountTakendown
	}
	return a, app, nil
}

// LoginTakendown is LoginAccount for createSession's allowTakendown: a
// taken-down account signs in too, with its account password only (an app
// password of a taken-down account is a wrong password, as in the
// reference PDS); start its session with CreateSession, which gives it
// ScopeTakendown.
func (s *Service) LoginTakendown(ctx context.Context, a *Account, password string) (*Account, *AppPasswordInfo, error) {
	a, app, err := s.checkLogin(ctx, a, password)
	if err != nil {
		return nil, nil, err
	}
	if a.Status == StatusTakendown && app != nil {
		return nil, nil, ErrAuthFailed
	}
	return a, app, nil
}

// checkLogin checks password against a's account password or app
// passwords, whatever a's status.
func (s *Service) checkLogin(ctx context.Context, a *Account, password string) (*Account, *AppPasswordInfo, error) {
	if a == nil {
		if err := s.hash.dummyVerify(ctx, password); err != nil {
			return nil, nil, err
		}
		return nil, nil, ErrAuthFailed
	}
	var app *AppPasswordInfo
	var err error
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
	return a, app, nil
}

// CreateSession starts a session for did (after Login).
func (s *Service) CreateSession(ctx context.Context, did syntax.DID, app *AppPasswordInfo) (*Session, error) {
	return s.startSession(ctx, did, func(tx pgx.Tx) (*Session, error) { return s.newSession(ctx, tx, did, app) })
}

// CreateTakendownSession starts the ScopeTakendown session of a taken-down
// account (after LoginTakendown): it lasts as long as its access token and
// cannot be refreshed.
func (s *Service) CreateTakendownSession(ctx context.Context, did syntax.DID) (*Session, error) {
	return s.startSession(ctx, did, func(tx pgx.Tx) (*Session, error) { return s.newTakendownSession(ctx, tx, did) })
}

func (s *Service) startSession(ctx context.Context, did syntax.DID, start func(pgx.Tx) (*Session, error)) (*Session, error) {
	var sess *Session
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Expired refresh rows are swept here, per account, rather than by
		// a background job.
		if _, err := tx.Exec(ctx, qDeleteExpiredRefreshTokens, did.String()); err != nil {
			return db.Translate(err)
		}
		var err error
		sess, err = start(tx)
		return err
	})
	return sess, err
}

// newTakendownSession stores and issues a ScopeTakendown session, whose
// refresh token expires with its access token.
func (s *Service) newTakendownSession(ctx context.Context, tx db.DBTX, did syntax.DID) (*Session, error) {
	sid, jti := randomID(), randomID()
	exp := s.cfg.Now().Add(s.cfg.AccessTTL)
	sess, err := s.tokens.issueWithExpiry(did, ScopeTakendown, sid, jti, exp)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, qInsertTakendownSession, jti, sid, did.String(), exp); err != nil {
		return nil, fmt.Errorf("storing session: %w", db.Translate(err))
	}
	return sess, nil
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

func (s *Service) newSession(ctx context.Context, tx db.DBTX, did syntax.DID, app *AppPasswordInfo) (*Session, error) {
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
		var privileged, takendown bool
		err := db.Translate(tx.QueryRow(ctx, qLockRefreshToken, c.ID, c.DID.String()).Scan(&sid, &appName, &privileged, &next, &takendown))
		if errors.Is(err, db.ErrNotFound) {
			return ruleErr(ErrInvalidToken, "refresh token has been revoked or has expired")
		}
		if err != nil {
			return err
		}
		if takendown {
			// Even after the takedown is lifted: such a session was opened
			// to move away, and signing in again gives a full one.
			return ruleErr(ErrInvalidToken, "a session of a taken-down account cannot be refreshed; sign in again")
		}
		var app *AppPasswordInfo
		if appName != nil {
			app = &AppPasswordInfo{Name: *appName, Privileged: privileged}
		}
		if next != nil {
			// Presented again within the grace period: the same successor.
			var exp time.Time
			err := db.Translate(tx.QueryRow(ctx, qRefreshTokenExpiry, *next).Scan(&exp))
			if errors.Is(err, db.ErrNotFound) {
				return ruleErr(ErrInvalidToken, "refresh token has been revoked or has expired")
			}
			if err != nil {
				return err
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
	err = db.Translate(s.pool.QueryRow(ctx, qSessionOfRefreshToken, c.ID, c.DID.String()).Scan(&sid))
	if errors.Is(err, db.ErrNotFound) {
		// Already ended: deleteSession is idempotent.
		return nil
	}
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, qDeleteSession, sid, c.DID.String())
	return db.Translate(err)
}

// Auth is an authenticated request's identity.
type Auth struct {
	DID    syntax.DID
	Handle syntax.Handle
	Status Status
	// Scope is the session token's scope (ScopeAccess, ScopeAppPass,
	// ScopeAppPassPrivileged), or an OAuth grant's scope.
	Scope string
	// SessionID names the session, or the OAuth grant.
	SessionID string
	// OAuth is set for a request made with an OAuth access token: what
	// the grant allows. Such a session is never full-access or
	// privileged; each method checks the permission it needs instead.
	OAuth *oauth.AccessInfo
}

// Takendown reports whether the session is one a taken-down account
// opened to move away (ScopeTakendown).
func (a *Auth) Takendown() bool { return a.OAuth == nil && a.Scope == ScopeTakendown }

// FullAccess reports whether the session was made with the account
// password (not an app password).
func (a *Auth) FullAccess() bool { return a.OAuth == nil && a.Scope == ScopeAccess }

// Privileged reports whether the session may use privileged methods (full
// access or a privileged app password).
func (a *Auth) Privileged() bool {
	return a.OAuth == nil && (a.Scope == ScopeAccess || a.Scope == ScopeAppPassPrivileged)
}

// AllowsRPC reports whether the session may call method lxm on the service
// aud (a did#service reference or a bare DID) through the service proxy or
// with a service-auth token: always for password and app-password sessions
// (their own rules, protected and privileged methods, apply elsewhere),
// and for an OAuth session only within its grant's rpc: permissions (or
// transition:generic, plus transition:chat.bsky for chat).
func (a *Auth) AllowsRPC(lxm, aud string) bool {
	if a.OAuth == nil {
		return true
	}
	return a.OAuth.CanRPC(lxm, aud)
}

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
	err = db.Translate(s.pool.QueryRow(ctx, qCheckSession, a.DID.String(), a.SessionID).Scan(&handle, &status, &live))
	if errors.Is(err, db.ErrNotFound) {
		return nil, ruleErr(ErrInvalidToken, "the account no longer exists")
	}
	if err != nil {
		return nil, fmt.Errorf("checking session: %w", err)
	}
	if !live {
		return nil, ruleErr(ErrInvalidToken, "the session has ended")
	}
	a.Handle, a.Status = syntax.Handle(handle), Status(status)
	return a, nil
}

// ParseAccess verifies an access token without the database: signature,
// type, audience, expiry, scope (ScopeTakendown included: check
// Auth.Takendown before letting it act). The account's state and the session's
// liveness are not checked: the caller must run WriteGuard in the
// transaction it acts in (or call Authenticate instead). Handle and Status
// of the result are unset.
func (s *Service) ParseAccess(accessToken string) (*Auth, error) {
	c, err := s.tokens.parse(accessToken, typAccess, ScopeAccess, ScopeAppPass, ScopeAppPassPrivileged, ScopeTakendown)
	if err != nil {
		return nil, err
	}
	return &Auth{DID: c.DID, Scope: c.Scope, SessionID: c.ID}, nil
}

// WriteGuard is the statement that, run first in a commit's transaction,
// aborts it unless a's account is active and a's session is alive: the
// check Authenticate makes, without a round trip of its own. A commit
// refused by it fails with an error for which IsSessionRefused is true.
func WriteGuard(a *Auth) *repo.Guard {
	return &repo.Guard{SQL: qCheckSessionGuard, Args: []any{a.DID.String(), a.SessionID}}
}

// IsSessionRefused reports whether err comes from a WriteGuard.
func IsSessionRefused(err error) bool {
	return errors.Is(db.Translate(err), db.ErrSessionRefused)
}

// CheckPassword reports whether password is did's account password (not
// an app password).
func (s *Service) CheckPassword(ctx context.Context, did syntax.DID, password string) error {
	a, err := s.Get(ctx, did)
	if err != nil {
		if errors.Is(err, ErrAccountNotFound) {
			if err := s.hash.dummyVerify(ctx, password); err != nil {
				return err
			}
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
