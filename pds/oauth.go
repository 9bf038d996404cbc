package pds

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/lexresolve"
	"github.com/bulwark-pds/bulwark/oauth"
)

// The OAuth authorization server (package oauth) on this server's mux:
// the metadata documents, PAR, the sign-in and consent pages, token,
// revocation and the connected-apps page, with accounts signed in through
// the account service under the createSession rate limit, every route
// under the oauth* rate limits of the client's address, and permission
// sets resolved through the outbound client (package lexresolve).

// newOAuth builds the authorization server of opts.OAuth over this
// server's database and accounts.
func (s *Server) newOAuth(opts Options, dids lexresolve.DIDResolver) (*oauth.Server, error) {
	if s.accounts == nil {
		return nil, errors.New("pds: OAuth needs accounts")
	}
	cfg := *opts.OAuth
	cfg.Pool = s.db
	cfg.Accounts = &oauthAccounts{s: s}
	// Every OAuth route is under the server's limiters, keyed by the
	// address the rest of the server sees.
	cfg.Limits = s.protect.limits
	cfg.ClientAddr = s.clientIP
	if cfg.Logger == nil {
		cfg.Logger = s.logger
	}
	// Permission sets (include: scopes) are resolved as the lexicon spec
	// publishes them, through the one guarded client and its resolver,
	// with DIDs from the server's directory.
	if cfg.Lexicons == nil {
		cfg.Lexicons = lexresolve.New(s.outbound, dids)
	}
	return oauth.New(cfg)
}

// OAuth is the authorization server (nil without Options.OAuth). The
// caller runs its Run, which deletes expired state.
func (s *Server) OAuth() *oauth.Server { return s.oauth }

// mountOAuth puts the OAuth endpoints on the server's mux. They run with
// the client's address in their context, which the sign-in rate limit is
// keyed by.
func (s *Server) mountOAuth() {
	if s.oauth == nil {
		return
	}
	om := &recordingMux{ServeMux: http.NewServeMux()}
	s.oauth.Routes(om)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		om.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientAddrKey, s.clientIP(r))))
	})
	// Every route oauth.Routes registers is under its per-address limits.
	s.handleSelfLimited("/oauth/", h, "", om.patterns)
	s.handleSelfLimited(oauth.PathASMetadata, h, "", nil)
	s.handleSelfLimited(oauth.PathRSMetadata, h, "", nil)
}

type clientAddrKeyType struct{}

// clientAddrKey holds the client's address in an OAuth request's context.
var clientAddrKey clientAddrKeyType

// oauthAccounts is oauth.Accounts over the account service.
type oauthAccounts struct{ s *Server }

// Login signs a person in on the authorization pages: the account's own
// password only (an app password is refused as a wrong password: it is
// for apps that cannot do OAuth), under the same limits as createSession
// (loginFrom), and for an account with the email sign-in factor on, the
// code mailed to it, checked (or, without one, mailed) by the same
// account-side step createSession takes (CheckAuthFactor): a wrong
// password never gets that far, so never mails.
func (o *oauthAccounts) Login(ctx context.Context, identifier, password, code string) (oauth.Account, error) {
	s := o.s
	addr, _ := ctx.Value(clientAddrKey).(netip.Addr)
	a, app, err := s.loginFrom(ctx, http.Header{}, addr, identifier, password)
	var xe *XRPCError
	switch {
	case errors.As(err, &xe) && xe.Status == http.StatusTooManyRequests:
		return oauth.Account{}, oauth.ErrRateLimited
	case errors.Is(err, account.ErrAuthFailed):
		return oauth.Account{}, oauth.ErrLoginFailed
	case errors.Is(err, account.ErrAccountTakendown):
		return oauth.Account{}, oauth.ErrAccountUnavailable
	case errors.Is(err, account.ErrPasswordBusy):
		return oauth.Account{}, fmt.Errorf("%w: %w", oauth.ErrBusy, err)
	case err != nil:
		return oauth.Account{}, err
	case app != nil:
		s.logger.Info("app password refused on the OAuth sign-in page", "did", a.DID)
		return oauth.Account{}, oauth.ErrLoginFailed
	}
	err = s.accounts.CheckAuthFactor(ctx, a, app, code)
	switch {
	case err == nil:
		return oauth.Account{DID: a.DID, Handle: a.Handle.String()}, nil
	case errors.Is(err, account.ErrAuthFactorTokenRequired):
		return oauth.Account{}, fmt.Errorf("%w: %w", oauth.ErrCodeRequired, err)
	case errors.Is(err, email.ErrTokenInvalid):
		return oauth.Account{}, fmt.Errorf("%w: %w", oauth.ErrCodeInvalid, err)
	case errors.Is(err, email.ErrTokenExpired):
		return oauth.Account{}, fmt.Errorf("%w: %w", oauth.ErrCodeExpired, err)
	case errors.Is(err, email.ErrRecipientLimited):
		return oauth.Account{}, fmt.Errorf("%w: %w", oauth.ErrRateLimited, err)
	}
	return oauth.Account{}, err
}

// Get returns an account that may use OAuth: any but a taken-down one (a
// deactivated account may sign in, as with createSession; the methods it
// may then call are the ones that allow a deactivated account).
func (o *oauthAccounts) Get(ctx context.Context, did syntax.DID) (oauth.Account, error) {
	a, err := o.s.accounts.Get(ctx, did)
	if errors.Is(err, account.ErrAccountNotFound) {
		return oauth.Account{}, oauth.ErrAccountUnavailable
	}
	if err != nil {
		return oauth.Account{}, err
	}
	if a.Status == account.StatusTakendown {
		return oauth.Account{}, oauth.ErrAccountUnavailable
	}
	return oauth.Account{DID: a.DID, Handle: a.Handle.String()}, nil
}
