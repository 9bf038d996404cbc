package pds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Password logins are what an attacker guesses with, and each check is a
// memory-hard hash, so three bounds apply before one is computed:
//
//   - the address's budget (loginAddress, an IPv6 /64 counting as one
//     address), whatever accounts it tries: one address guessing many
//     accounts, or many unknown identifiers, is slowed;
//   - the account's budget (createSession), keyed by its DID whichever of
//     handle, email or DID names it, so that one account has one budget;
//     a login for no account is keyed by its normalised identifier;
//   - the hash slots (one per core): a login that finds them taken waits
//     its turn in a FIFO queue (--password-queue places, at most
//     --password-wait), and is answered 503 ServiceOverloaded with
//     Retry-After only when the queue is full, its address already holds
//     half of it, or the wait runs out; its points are then given back,
//     since nothing was checked.
//
// The budgets come first, so a flood from one address is refused (429)
// after its 30th login in five minutes and never holds more than that in
// the queue; the queue's half-share bounds the methods whose budgets are
// larger (createAccount's 100 in five minutes).

// login checks a password login and returns the account and the app
// password used (nil for the account password).
func (s *Server) login(w http.ResponseWriter, r *http.Request, identifier, password string) (*account.Account, *account.AppPasswordInfo, error) {
	return s.loginFrom(r.Context(), w.Header(), s.clientIP(r), identifier, password)
}

// loginOptions are what a login accepts beyond an active or deactivated
// account's credentials.
type loginOptions struct {
	// allowTakendown lets a taken-down account in with its account
	// password (createSession's allowTakendown).
	allowTakendown bool
	// factorToken is the mailed sign-in code of an account with
	// emailAuthFactor on (createSession's authFactorToken).
	factorToken string
}

// loginWith is login with options, and the second factor checked: an
// account with emailAuthFactor on that signs in with its password gets
// account.ErrAuthFactorTokenRequired (and a mailed code) without
// o.factorToken, or has it checked. Only a right password gets that far,
// so a wrong one never sends mail.
func (s *Server) loginWith(w http.ResponseWriter, r *http.Request, identifier, password string, o loginOptions) (*account.Account, *account.AppPasswordInfo, error) {
	a, app, err := s.checkLogin(r.Context(), w.Header(), s.clientIP(r), identifier, password, o.allowTakendown)
	if err != nil {
		return nil, nil, err
	}
	if err := s.accounts.CheckAuthFactor(r.Context(), a, app, o.factorToken); err != nil {
		return nil, nil, err
	}
	return a, app, nil
}

// loginFrom is login for a client at addr, with the rate limits' headers
// set on h. The OAuth sign-in page shares it, so both ways of signing in
// spend the same budgets.
func (s *Server) loginFrom(ctx context.Context, h http.Header, addr netip.Addr, identifier, password string) (*account.Account, *account.AppPasswordInfo, error) {
	return s.checkLogin(ctx, h, addr, identifier, password, false)
}

// checkLogin is loginFrom, letting a taken-down account in when
// allowTakendown is set.
func (s *Server) checkLogin(ctx context.Context, h http.Header, addr netip.Addr, identifier, password string, allowTakendown bool) (*account.Account, *account.AppPasswordInfo, error) {
	addrKey := ratelimit.IPKey(addr)
	ctx = account.WithClient(ctx, addrKey)
	if err := s.rateLimitHeader(h, ratelimit.PolicyLoginAddress, addrKey, 1); err != nil {
		return nil, nil, err
	}
	a, err := s.accounts.Lookup(ctx, identifier)
	if err != nil && !errors.Is(err, account.ErrAccountNotFound) {
		return nil, nil, err
	}
	acctKey := loginKey(a, identifier)
	if err := s.rateLimitHeader(h, ratelimit.PolicyCreateSession, acctKey, 1); err != nil {
		return nil, nil, err
	}
	if len(password) > account.MaxPasswordLength {
		// No password that long was ever accepted; hashing it would
		// only cost time.
		return nil, nil, account.ErrAuthFailed
	}
	check := s.accounts.LoginAccount
	if allowTakendown {
		check = s.accounts.LoginTakendown
	}
	a, app, err := check(ctx, a, password)
	if errors.Is(err, account.ErrPasswordBusy) {
		s.protect.limits.Get(ratelimit.PolicyLoginAddress).Refund(addrKey, 1)
		s.protect.limits.Get(ratelimit.PolicyCreateSession).Refund(acctKey, 1)
		return nil, nil, err
	}
	return a, app, err
}

// loginKey is the per-account login limit's key: the account's DID, or,
// for an identifier no account has, the identifier as Lookup would read it
// (its hash when it is longer than any real identifier, so that a client
// cannot make the limiter store long keys).
func loginKey(a *account.Account, identifier string) string {
	if a != nil {
		return a.DID.String()
	}
	id := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(identifier), "@"))
	if len(id) > maxIdentifierKey {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return id
}
