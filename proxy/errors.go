package proxy

import (
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors. Every error this package returns is an [*Error] whose
// cause wraps one of these, so callers may test with errors.Is and answer
// with errors.As.
var (
	// ErrBadHeader: the atproto-proxy header is malformed.
	ErrBadHeader = errors.New("invalid atproto-proxy header")
	// ErrUnknownDID: the DID named by the header does not resolve.
	ErrUnknownDID = errors.New("could not resolve proxy DID")
	// ErrUnknownService: the DID document has no usable service entry with
	// the requested id.
	ErrUnknownService = errors.New("proxy DID has no such service")
	// ErrResolution: DID resolution failed for a reason other than the DID
	// not existing (network, directory down); worth retrying.
	ErrResolution = errors.New("DID resolution failed")
	// ErrNotConfigured: no service is configured for the method.
	ErrNotConfigured = errors.New("no service configured for method")
	// ErrProtectedMethod: the method manages the account and is never
	// proxied nor given a service token.
	ErrProtectedMethod = errors.New("method cannot be proxied")
	// ErrPrivilegedMethod: the method needs a privileged session.
	ErrPrivilegedMethod = errors.New("method needs privileged access")
	// ErrNotPermitted: the caller's grant (Caller.Permits) does not reach
	// the method at its target.
	ErrNotPermitted = errors.New("method not permitted at this service")
	// ErrBadRequest: the request cannot be forwarded as sent (HTTP method,
	// oversized header, malformed parameter).
	ErrBadRequest = errors.New("request cannot be proxied")
	// ErrRequestTooLarge: the request body is over the limit.
	ErrRequestTooLarge = errors.New("request body too large")
	// ErrUpstreamFailure: the upstream service failed, was unreachable,
	// answered 500 or a redirect.
	ErrUpstreamFailure = errors.New("upstream service failed")
	// ErrUpstreamStatus: the upstream service answered with a server
	// error other than 500, which is passed on as it was (its status, and
	// its XRPC error name and message), as the reference PDS does.
	ErrUpstreamStatus = errors.New("upstream service answered with an error")
	// ErrUpstreamTimeout: the upstream service did not answer, or stalled
	// while sending its body, past the configured timeouts.
	ErrUpstreamTimeout = errors.New("upstream service timed out")
	// ErrResponseTooLarge: the upstream response is over the limit.
	ErrResponseTooLarge = errors.New("upstream response too large")
	// ErrUnknownFeed: app.bsky.feed.getFeed names a feed generator the app
	// view does not know.
	ErrUnknownFeed = errors.New("unknown feed generator")
	// ErrSigning: no service token could be minted (no key for the
	// account). A server fault, not the client's.
	ErrSigning = errors.New("cannot mint service token")
	// ErrCanceled: the client went away before the exchange finished.
	ErrCanceled = errors.New("client canceled the request")
)

// StatusClientClosedRequest is the status recorded when the client went
// away. Nobody receives it; it keeps such requests apart in metrics.
const StatusClientClosedRequest = 499

// Error is an error to answer as the XRPC error body
// {"error": Name, "message": Message} with HTTP status Status.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Name is the XRPC error name, like UpstreamFailure.
	Name string
	// Message is for the client: it names what failed, never secrets.
	Message string
	// Err wraps the sentinel and the underlying cause; it is for logs.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Err != nil {
		return e.Name + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Name + ": " + e.Message
}

// Unwrap exposes the sentinel (and cause) to errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

// newError builds an *Error for sentinel with a client message; cause, when
// not nil, is kept for logs.
func newError(sentinel error, cause error, format string, args ...any) *Error {
	status, name := statusFor(sentinel)
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	err := sentinel
	if cause != nil {
		err = fmt.Errorf("%w: %w", sentinel, cause)
	}
	return &Error{Status: status, Name: name, Message: msg, Err: err}
}

// statusFor is the one place sentinels meet HTTP statuses and XRPC names.
func statusFor(sentinel error) (int, string) {
	switch sentinel {
	case ErrBadHeader, ErrUnknownDID, ErrUnknownService, ErrBadRequest:
		return http.StatusBadRequest, "InvalidRequest"
	case ErrProtectedMethod, ErrPrivilegedMethod:
		// The reference PDS's answer: a 400 named InvalidToken.
		return http.StatusBadRequest, "InvalidToken"
	case ErrNotPermitted:
		// RFC 6750's insufficient_scope, as an XRPC error.
		return http.StatusForbidden, "InsufficientScope"
	case ErrUnknownFeed:
		return http.StatusBadRequest, "UnknownFeed"
	case ErrNotConfigured:
		return http.StatusNotImplemented, "MethodNotImplemented"
	case ErrRequestTooLarge:
		return http.StatusRequestEntityTooLarge, "PayloadTooLarge"
	case ErrResolution, ErrUpstreamFailure, ErrResponseTooLarge:
		return http.StatusBadGateway, "UpstreamFailure"
	case ErrUpstreamTimeout:
		return http.StatusGatewayTimeout, "UpstreamTimeout"
	case ErrCanceled:
		return StatusClientClosedRequest, "ClientClosedRequest"
	default: // ErrSigning and anything unforeseen
		return http.StatusInternalServerError, "InternalServerError"
	}
}

// standardNames are the XRPC error names of HTTP statuses (the reference
// implementation's ResponseType), for an upstream error that names none.
var standardNames = map[int]string{
	http.StatusBadRequest:            "InvalidRequest",
	http.StatusUnauthorized:          "AuthenticationRequired",
	http.StatusForbidden:             "Forbidden",
	http.StatusNotFound:              "XRPCNotSupported",
	http.StatusNotAcceptable:         "NotAcceptable",
	http.StatusRequestEntityTooLarge: "PayloadTooLarge",
	http.StatusUnsupportedMediaType:  "UnsupportedMediaType",
	http.StatusTooManyRequests:       "RateLimitExceeded",
	http.StatusInternalServerError:   "InternalServerError",
	http.StatusNotImplemented:        "MethodNotImplemented",
	http.StatusBadGateway:            "UpstreamFailure",
	http.StatusServiceUnavailable:    "NotEnoughResources",
	http.StatusGatewayTimeout:        "UpstreamTimeout",
}

// upstreamStatusError is ErrUpstreamStatus for an upstream answer with
// status (501-599) and its XRPC error name and message, if it had them.
func upstreamStatusError(status int, name, msg string) *Error {
	if name == "" {
		name = standardNames[status]
		if name == "" {
			name = "UpstreamFailure"
		}
	}
	if msg == "" {
		msg = fmt.Sprintf("upstream service answered %d %s", status, http.StatusText(status))
	}
	return &Error{Status: status, Name: name, Message: msg, Err: fmt.Errorf("%w: %d", ErrUpstreamStatus, status)}
}
