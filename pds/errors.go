package pds

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// XRPCError is an error answered to the client as the XRPC error body
// {"error": Name, "message": Message} with HTTP status Status. Handlers
// return one (or a domain error that xrpcErrorFor maps to one).
type XRPCError struct {
	// Status is the HTTP status code.
	Status int
	// Name is the machine-readable error name, like InvalidRequest.
	Name string
	// Message is for humans; it is sent to the client, so it must not
	// carry secrets or internal details.
	Message string
	// Header holds extra response headers, like Retry-After.
	Header http.Header
	// Err is the underlying cause. It is logged, never sent.
	Err error
}

// Error implements error.
func (e *XRPCError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Name, e.Message, e.Err)
	}
	return e.Name + ": " + e.Message
}

// Unwrap returns the cause, so errors.Is sees through an XRPCError.
func (e *XRPCError) Unwrap() error { return e.Err }

// xrpcErrorBody is the wire form of an XRPCError.
type xrpcErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func newError(status int, name, format string, args ...any) *XRPCError {
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	return &XRPCError{Status: status, Name: name, Message: msg}
}

// InvalidRequest is the generic 400 for input that is malformed or breaks a
// rule; the message says which.
func InvalidRequest(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "InvalidRequest", format, args...)
}

// AuthRequired is a 401 for a request that needs credentials and has none
// (or the wrong kind). Its name is the one the reference server uses.
func AuthRequired(format string, args ...any) *XRPCError {
	return newError(http.StatusUnauthorized, "AuthenticationRequired", format, args...)
}

// InvalidToken is a 401 for a token that does not verify.
func InvalidToken(format string, args ...any) *XRPCError {
	return newError(http.StatusUnauthorized, "InvalidToken", format, args...)
}

// ExpiredToken is a 401 for a token past its expiry; clients refresh on it.
func ExpiredToken(format string, args ...any) *XRPCError {
	return newError(http.StatusUnauthorized, "ExpiredToken", format, args...)
}

// Forbidden is a 403 for an authenticated caller who may not do this.
func Forbidden(format string, args ...any) *XRPCError {
	return newError(http.StatusForbidden, "Forbidden", format, args...)
}

// RecordNotFound is the 400 the lexicons specify for a missing record.
func RecordNotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "RecordNotFound", format, args...)
}

// RepoNotFound is the 400 the lexicons specify for an unknown repo.
func RepoNotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "RepoNotFound", format, args...)
}

// InvalidSwap is the 400 for a swapCommit/swapRecord that no longer matches.
func InvalidSwap(format string, args ...any) *XRPCError {
	return newError(http.StatusBadRequest, "InvalidSwap", format, args...)
}

// NotFound is a 404 for a path that is not an XRPC method.
func NotFound(format string, args ...any) *XRPCError {
	return newError(http.StatusNotFound, "NotFound", format, args...)
}

// MethodNotImplemented is the 501 for an XRPC method this server does not
// serve.
func MethodNotImplemented(format string, args ...any) *XRPCError {
	return newError(http.StatusNotImplemented, "MethodNotImplemented", format, args...)
}

// MethodNotAllowed is the 405 for a query called with POST or a procedure
// called with GET. allow is the verb list for the Allow header. The name is
// InvalidRequest: XRPC has no name of its own for this, and clients know
// that one.
func MethodNotAllowed(allow, format string, args ...any) *XRPCError {
	e := newError(http.StatusMethodNotAllowed, "InvalidRequest", format, args...)
	e.Header = http.Header{"Allow": {allow}}
	return e
}

// PayloadTooLarge is the 413 for a request body over the method's limit.
func PayloadTooLarge(format string, args ...any) *XRPCError {
	return newError(http.StatusRequestEntityTooLarge, "PayloadTooLarge", format, args...)
}

// RateLimitExceeded is the 429 for a client over a rate limit; retryAfter
// becomes the Retry-After header (whole seconds, rounded up).
func RateLimitExceeded(retryAfter time.Duration, format string, args ...any) *XRPCError {
	e := newError(http.StatusTooManyRequests, "RateLimitExceeded", format, args...)
	secs := int64((retryAfter + time.Second - 1) / time.Second)
	e.Header = http.Header{"Retry-After": {strconv.FormatInt(max(secs, 1), 10)}}
	return e
}

// NotEnoughResources is the 503 for work refused because the server is
// saturated (a full wait queue), as opposed to a client over its limit.
func NotEnoughResources(format string, args ...any) *XRPCError {
	return newError(http.StatusServiceUnavailable, "NotEnoughResources", format, args...)
}

// UpstreamFailure is the 502 for a proxied service that failed.
func UpstreamFailure(format string, args ...any) *XRPCError {
	return newError(http.StatusBadGateway, "UpstreamFailure", format, args...)
}

// InternalServerError is the 500 for everything unexpected. Its message is
// deliberately generic; the cause goes to the log with the request id.
func InternalServerError() *XRPCError {
	return newError(http.StatusInternalServerError, "InternalServerError", "internal server error")
}

// errorMapping is one row of domainErrors: a domain sentinel and the XRPC
// error a client gets for an error that wraps it.
type errorMapping struct {
	sentinel error
	status   int
	name     string
	// build, when set, makes the XRPC error instead of the default
	// {status, name, err.Error()}: a fixed message, a header, or the
	// cause kept for the log.
	build func(err error) *XRPCError
}

// domainErrors is the one table from the domain packages' sentinel errors
// to XRPC errors, most specific first. A domain error's message is written
// for clients (the packages wrap their sentinels with what went wrong); an
// error no row matches is a 500 whose cause only the log sees. Handlers
// that answer differently in one place (admin methods call an unknown
// subject NotFound) test for the sentinel themselves before returning.
var domainErrors = []errorMapping{
	// The event log's repairs (admin methods).
	{sentinel: eventlog.ErrNoEvent, status: http.StatusBadRequest, name: "EventNotFound"},
	{sentinel: eventlog.ErrNotRepairable, status: http.StatusBadRequest, name: "InvalidRequest"},

	// Sessions and accounts. Token errors are 400s, as in the reference
	// PDS: clients refresh on ExpiredToken by name.
	{sentinel: account.ErrExpiredToken, status: http.StatusBadRequest, name: "ExpiredToken"},
	{sentinel: account.ErrInvalidToken, status: http.StatusBadRequest, name: "InvalidToken"},
	{sentinel: account.ErrAccountDeactivated, status: http.StatusUnauthorized, name: "AccountDeactivated"},
	{sentinel: account.ErrAccountTakendown, status: http.StatusUnauthorized, name: "AccountTakedown"},
	{sentinel: account.ErrAuthFailed, status: http.StatusUnauthorized, name: "AuthenticationRequired"},
	{sentinel: account.ErrAuthFactorTokenRequired, status: http.StatusUnauthorized, name: "AuthFactorTokenRequired"},
	{sentinel: account.ErrEmailNotConfirmed, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrInvalidRecoveryKey, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrInvalidDID, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrHandleNotResolved, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrInvalidHandle, status: http.StatusBadRequest, name: "InvalidHandle"},
	{sentinel: account.ErrUnsupportedDomain, status: http.StatusBadRequest, name: "UnsupportedDomain"},
	{sentinel: account.ErrHandleNotAvailable, status: http.StatusBadRequest, name: "HandleNotAvailable"},
	{sentinel: account.ErrInvalidPassword, status: http.StatusBadRequest, name: "InvalidPassword"},
	{sentinel: account.ErrInvalidInviteCode, status: http.StatusBadRequest, name: "InvalidInviteCode"},
	{sentinel: account.ErrInvalidEmail, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrEmailTaken, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrUnsupportedDID, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrAppPasswordExists, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrInvalidAppPassword, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrAppPasswordNotFound, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrAccountNotFound, status: http.StatusBadRequest, name: "AccountNotFound"},
	{sentinel: account.ErrAccountExists, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrIncompatibleDIDDoc, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrIncompatiblePLCOp, status: http.StatusBadRequest, name: "IncompatibleDidDoc"},
	{sentinel: account.ErrDIDNotResolved, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrNotPLC, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrServiceAuthReplayed, status: http.StatusUnauthorized, name: "JwtReplayed", build: func(err error) *XRPCError {
		e := newError(http.StatusUnauthorized, "JwtReplayed", "this service-auth JWT was used already: each works once; get a new one (com.atproto.server.getServiceAuth on the account's current server)")
		e.Err = err
		return e
	}},
	{sentinel: account.ErrInvalidPLCOperation, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: account.ErrInvalidPreferences, status: http.StatusBadRequest, name: "InvalidRequest"},

	// Mailed codes and the mail flows, named as the reference PDS names
	// them.
	{sentinel: email.ErrTokenExpired, status: http.StatusBadRequest, name: "ExpiredToken"},
	{sentinel: email.ErrTokenInvalid, status: http.StatusBadRequest, name: "InvalidToken"},
	{sentinel: account.ErrTokenRequired, status: http.StatusBadRequest, name: "TokenRequired"},
	{sentinel: account.ErrEmailMismatch, status: http.StatusBadRequest, name: "InvalidEmail"},
	{sentinel: account.ErrNoEmail, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: email.ErrInvalidMessage, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: email.ErrRecipientLimited, status: http.StatusTooManyRequests, name: "RateLimitExceeded", build: recipientLimited},

	// The repository engine.
	{sentinel: repo.ErrLimitExceeded, status: http.StatusBadRequest, name: "InvalidRequest", build: limitExceeded},
	{sentinel: repo.ErrInvalidSwap, status: http.StatusBadRequest, name: "InvalidSwap"},
	{sentinel: repo.ErrRecordNotFound, status: http.StatusBadRequest, name: "RecordNotFound"},
	{sentinel: repo.ErrRepoNotFound, status: http.StatusBadRequest, name: "RepoNotFound"},
	{sentinel: repo.ErrRecordExists, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: repo.ErrInvalidWrite, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: repo.ErrInvalidImport, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: repo.ErrImportTooLarge, status: http.StatusRequestEntityTooLarge, name: "PayloadTooLarge"},
	{sentinel: repo.ErrImportRead, status: http.StatusBadRequest, name: "InvalidRequest", build: func(err error) *XRPCError {
		return InvalidRequest("the repository CAR did not arrive whole: %v", err)
	}},

	// The PLC directory.
	{sentinel: plc.ErrNotControlled, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: plc.ErrTombstoned, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: plc.ErrInvalidOperation, status: http.StatusBadRequest, name: "InvalidRequest"},
	{sentinel: plc.ErrDirectory, status: http.StatusBadGateway, name: "UpstreamFailure", build: func(err error) *XRPCError {
		e := UpstreamFailure("the PLC directory did not accept the operation; nothing was changed")
		e.Err = err
		return e
	}},

	// Blobs.
	{sentinel: blob.ErrBlobNotFound, status: http.StatusBadRequest, name: "BlobNotFound"},
	{sentinel: blob.ErrInvalidMimeType, status: http.StatusBadRequest, name: "InvalidMimeType"},
	{sentinel: blob.ErrInvalidSize, status: http.StatusBadRequest, name: "InvalidSize"},
	{sentinel: blob.ErrTooLarge, status: http.StatusRequestEntityTooLarge, name: "PayloadTooLarge"},
	{sentinel: blob.ErrUploadRead, status: http.StatusBadRequest, name: "InvalidRequest", build: func(err error) *XRPCError {
		return InvalidRequest("the upload did not arrive whole: %v", err)
	}},

	// The in-flight byte budget's full queue: a refusal under load.
	{sentinel: budget.ErrOverloaded, status: http.StatusServiceUnavailable, name: "ServiceOverloaded", build: overloaded},
	// Too many changes waiting for the PLC directory: a refusal under load.
	{sentinel: account.ErrDirectoryBusy, status: http.StatusServiceUnavailable, name: "ServiceOverloaded", build: func(err error) *XRPCError {
		e := ServiceOverloaded(time.Second, "too many accounts and identities being updated at once; retry in a moment")
		e.Err = err
		return e
	}},
	// Every password-hash slot taken: a refusal under load.
	{sentinel: account.ErrPasswordBusy, status: http.StatusServiceUnavailable, name: "ServiceOverloaded", build: func(err error) *XRPCError {
		e := ServiceOverloaded(time.Second, "too many password checks in progress; retry in a moment")
		e.Err = err
		return e
	}},

	// The database went away in the middle of the request (a failover, a
	// restart, a network failure): the transaction committed whole or not
	// at all, and a retry in a moment reaches the new primary.
	{sentinel: db.ErrUnavailable, status: http.StatusServiceUnavailable, name: "ServiceUnavailable", build: func(err error) *XRPCError {
		e := newError(http.StatusServiceUnavailable, "ServiceUnavailable", "the database is unavailable (failing over or restarting); retry in a moment")
		e.Header = http.Header{"Retry-After": {"1"}}
		e.Err = err
		return e
	}},

	// Text Postgres cannot store. The strings the server stores come from
	// requests, and JSON may carry a NUL ("\u0000") in any field a handler
	// does not parse further (an app password's name, an invite note, an
	// audit reason), so such a refusal is the client's mistake, not a 500.
	// The statement failed, so its transaction wrote nothing. (Query
	// parameters are checked earlier, by params, with the parameter's name.)
	{sentinel: db.ErrInvalidText, status: http.StatusBadRequest, name: "InvalidRequest", build: func(error) *XRPCError {
		return InvalidRequest("the request holds text that cannot be stored: a NUL character (\\u0000) or invalid UTF-8")
	}},
}

// limitExceeded names the protocol limit a write broke and the size that
// broke it.
func limitExceeded(err error) *XRPCError {
	msg := err.Error()
	var le *repo.LimitError
	if errors.As(err, &le) {
		msg = le.Error()
	}
	return InvalidRequest("%s", msg)
}

// recipientLimited is a code request refused because its address had its
// share of mail (ratelimit.PolicyMailRecipient), with the limit's
// RateLimit-* headers and Retry-After.
func recipientLimited(err error) *XRPCError {
	var rl *email.RecipientLimitError
	if !errors.As(err, &rl) {
		return RateLimitExceeded(time.Minute, "too much mail to this address; retry later")
	}
	d := rl.Decision
	e := newError(http.StatusTooManyRequests, "RateLimitExceeded", "too much mail to this account's address (%s: %d per %s); retry in %s",
		ratelimit.PolicyMailRecipient, d.Rule.Limit, d.Rule.Window, d.RetryAfter.Round(time.Second))
	e.Header = ratelimit.Headers(d, time.Now())
	e.Err = err
	return e
}

// overloaded is the budget's refusal, with its Retry-After.
func overloaded(err error) *XRPCError {
	var retryAfter time.Duration
	var oe *budget.OverloadedError
	if errors.As(err, &oe) {
		retryAfter = oe.RetryAfter
	}
	e := ServiceOverloaded(retryAfter, "server overloaded: too many large responses in flight; retry later")
	e.Err = err
	return e
}

// xrpcErrorFor maps any error a handler returns to the XRPC error the client
// gets: an *XRPCError as it is, a body over its limit as PayloadTooLarge, a
// domain error through domainErrors (after db.Translate, so that a driver
// error no storage function translated is still recognised), and anything
// else as a 500 with a generic message.
func xrpcErrorFor(err error) *XRPCError {
	var xe *XRPCError
	if errors.As(err, &xe) {
		return xe
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return PayloadTooLarge("request body is larger than %d bytes", tooLarge.Limit)
	}
	translated := db.Translate(err)
	for _, m := range domainErrors {
		if !errors.Is(translated, m.sentinel) {
			continue
		}
		if m.build != nil {
			return m.build(err)
		}
		return newError(m.status, m.name, "%s", err.Error())
	}
	e := InternalServerError()
	e.Err = err
	return e
}
