package pds

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/golang-jwt/jwt/v5"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/replay"
)

// Moving an account between servers: the PLC operation methods, and the
// service-auth check of createAccount with an existing DID. The order of
// calls a client (goat's `account migrate`) makes is: new server
// createAccount{did} with a service-auth JWT from the old one (the
// account starts deactivated), importRepo, putPreferences, uploadBlob;
// new getRecommendedDidCredentials; old signPlcOperation (with the mailed
// code); new submitPlcOperation; new activateAccount; old
// deactivateAccount.

// registerPLCRoutes registers signPlcOperation and submitPlcOperation.
func (s *Server) registerPLCRoutes() {
	if s.accounts == nil {
		return
	}
	s.procedure("com.atproto.identity.signPlcOperation", s.handleSignPlcOperation)
	s.procedure("com.atproto.identity.submitPlcOperation", s.handleSubmitPlcOperation)
}

// newServiceAuthValidator checks service-auth JWTs addressed to this
// server against the issuer's current DID document, resolved through the
// configured PLC directory (did:plc) or the guarded outbound client
// (did:web). indigo's validator purges a cached document and resolves it
// again when a signature does not verify, so a key that just changed is
// picked up.
func newServiceAuthValidator(cfg *config.Config, dir identity.Directory) *auth.ServiceAuthValidator {
	return &auth.ServiceAuthValidator{Audience: cfg.ServiceDID(), Dir: dir, TimestampLeeway: serviceAuthLeeway}
}

// serviceAuthLeeway is the clock skew allowed on a service-auth JWT's
// timestamps (indigo's default). A used token is remembered until its exp
// plus this, when the validator stops accepting it.
const serviceAuthLeeway = 5 * time.Second

// verifyMigrationAuth checks createAccount's bearer token when the request
// brings an existing DID: a service-auth JWT issued by that DID, for this
// server, for com.atproto.server.createAccount, unexpired, signed with the
// DID's current key, with a jti, living at most account.ServiceAuthMaxTTL.
// The errors are 401s with the reference PDS's names. It returns the use
// the account's transaction records, so that the token works once.
func (s *Server) verifyMigrationAuth(r *http.Request, did string) (*account.ServiceAuthUse, error) {
	token, err := bearerToken(r)
	if err != nil {
		return nil, err
	}
	if token == "" {
		return nil, AuthRequired("creating an account for an existing DID needs a service-auth JWT of %.100s (com.atproto.server.getServiceAuth on its current server) as the Bearer token", did)
	}
	lxm := syntax.NSID(createAccountNSID)
	iss, err := s.serviceAuth.Validate(r.Context(), token, &lxm)
	if err != nil {
		return nil, serviceAuthError(err)
	}
	if iss.String() != did {
		return nil, AuthRequired("the service-auth JWT was issued by %s, not %.100s: missing auth to create an account with that DID", iss, did)
	}
	return s.serviceAuthUse(token, iss, createAccountNSID)
}

// serviceAuthUse reads the jti and exp of token, a service-auth JWT
// Validate accepted, as the use to record for purpose. A token without a
// jti, or living longer than account.ServiceAuthMaxTTL (plus the
// validator's leeway), is refused: it could not be remembered for as long
// as it works.
func (s *Server) serviceAuthUse(token string, iss syntax.DID, purpose string) (*account.ServiceAuthUse, error) {
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil || claims.ExpiresAt == nil {
		return nil, newError(http.StatusUnauthorized, "BadJwt", "the service-auth JWT is malformed or incomplete")
	}
	if !replay.ValidID(claims.ID) {
		return nil, newError(http.StatusUnauthorized, "BadJwt", "the service-auth JWT has no usable jti (1 to %d printable characters): this server accepts each token once", replay.MaxIDLen)
	}
	exp := claims.ExpiresAt.Time
	if exp.After(time.Now().Add(account.ServiceAuthMaxTTL + serviceAuthLeeway)) {
		return nil, newError(http.StatusUnauthorized, "BadJwt", "the service-auth JWT expires more than %s from now", account.ServiceAuthMaxTTL)
	}
	return &account.ServiceAuthUse{Purpose: purpose, Issuer: iss.String(), ID: claims.ID, Expires: exp.Add(serviceAuthLeeway)}, nil
}

// serviceAuthError names why a service-auth JWT was refused, as the
// reference PDS's xrpc-server does.
func serviceAuthError(err error) *XRPCError {
	var e *XRPCError
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		e = newError(http.StatusUnauthorized, "JwtExpired", "the service-auth JWT has expired")
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		e = newError(http.StatusUnauthorized, "BadJwtAudience", "the service-auth JWT is not addressed to this server")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		e = newError(http.StatusUnauthorized, "BadJwtSignature", "the service-auth JWT's signature does not verify with the issuer's current signing key")
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		e = newError(http.StatusUnauthorized, "BadJwtIssuer", "the service-auth JWT's issuer could not be resolved to a DID document with a signing key")
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued), errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		e = newError(http.StatusUnauthorized, "BadJwt", "the service-auth JWT is not valid yet or lacks exp")
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		// What is left of the claim errors (golang-jwt joins each claim
		// error with this one) is indigo's lxm check.
		e = newError(http.StatusUnauthorized, "BadJwtLexiconMethod", "the service-auth JWT is not bound to %s (lxm)", createAccountNSID)
	default:
		e = newError(http.StatusUnauthorized, "BadJwt", "the service-auth JWT is malformed or incomplete")
	}
	e.Err = err
	return e
}

// signPlcOperationInput is signPlcOperation's input: the mailed code, and
// the fields that replace the current operation's (absent: kept).
type signPlcOperationInput struct {
	Token               string                      `json:"token"`
	RotationKeys        []string                    `json:"rotationKeys"`
	AlsoKnownAs         []string                    `json:"alsoKnownAs"`
	VerificationMethods map[string]string           `json:"verificationMethods"`
	Services            map[string]didplc.OpService `json:"services"`
}

func (s *Server) handleSignPlcOperation(w http.ResponseWriter, r *http.Request) error {
	// A taken-down account may sign the operation that moves it away.
	a, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated(), allowTakendown(), oauthIdentity("*"))
	if err != nil {
		return err
	}
	var in signPlcOperationInput
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Token == "" {
		return InvalidRequest("email confirmation token required to sign PLC operations (com.atproto.identity.requestPlcOperationSignature mails it)")
	}
	op, err := s.accounts.SignPLCOperation(r.Context(), a.DID, in.Token, plc.Overrides{
		RotationKeys: in.RotationKeys, AlsoKnownAs: in.AlsoKnownAs,
		VerificationMethods: in.VerificationMethods, Services: in.Services,
	})
	switch {
	case errors.Is(err, email.ErrTokenExpired):
		return tokenExpired("the PLC operation token has expired: request a new one")
	case errors.Is(err, email.ErrTokenInvalid):
		return tokenInvalid("the PLC operation token is invalid, used or replaced by a newer one")
	case err != nil:
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]any{"operation": op})
}

func (s *Server) handleSubmitPlcOperation(w http.ResponseWriter, r *http.Request) error {
	a, err := s.requireAuth(r, fullAccessOnly(), allowDeactivated(), oauthIdentity("*"))
	if err != nil {
		return err
	}
	var in struct {
		Operation json.RawMessage `json:"operation"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if len(in.Operation) == 0 || string(in.Operation) == "null" {
		return InvalidRequest("operation is required")
	}
	var op didplc.RegularOp
	if err := json.Unmarshal(in.Operation, &op); err != nil {
		return InvalidRequest("operation is not a PLC operation: %v", err)
	}
	err = s.accounts.SubmitPLCOperation(r.Context(), a.DID, &op)
	if errors.Is(err, plc.ErrRejected) {
		e := InvalidRequest("the PLC directory rejected the operation: %v", err)
		e.Err = err
		return e
	}
	if err != nil {
		return err
	}
	// Service-auth JWTs of this DID are checked against its new document
	// from now on.
	_ = s.serviceAuth.Dir.Purge(r.Context(), a.DID.AtIdentifier())
	w.WriteHeader(http.StatusOK)
	return nil
}
