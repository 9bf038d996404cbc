package oauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/bulwark-pds/bulwark/oauth/dpop"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// OAuth error codes (RFC 6749, RFC 9449, RFC 6750).
const (
	CodeInvalidRequest   = "invalid_request"
	CodeInvalidClient    = "invalid_client"
	CodeInvalidGrant     = "invalid_grant"
	CodeInvalidScope     = "invalid_scope"
	CodeUnauthorized     = "unauthorized_client"
	CodeUnsupportedGrant = "unsupported_grant_type"
	CodeUnsupportedResp  = "unsupported_response_type"
	CodeAccessDenied     = "access_denied"
	CodeInvalidDPoP      = "invalid_dpop_proof"
	CodeUseDPoPNonce     = "use_dpop_nonce"
	CodeInvalidToken     = "invalid_token"
	CodeServerError      = "server_error"
	CodeRequestNotSupp   = "request_not_supported"
	// CodeInsufficientScope is for the integrator: a token lacks the
	// permission a method needs (RFC 6750, 403).
	CodeInsufficientScope = "insufficient_scope"
)

// Error is an OAuth error response: an HTTP status, a code from the list
// above and a description safe to show the client.
type Error struct {
	Status      int
	Code        string
	Description string
	cause       error
	// retryAfter, when set, is sent as Retry-After.
	retryAfter time.Duration
}

func (e *Error) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Description, e.cause)
	}
	return e.Code + ": " + e.Description
}

func (e *Error) Unwrap() error { return e.cause }

func oauthErr(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Description: fmt.Sprintf(format, args...)}
}

func invalidRequest(format string, args ...any) *Error {
	return oauthErr(http.StatusBadRequest, CodeInvalidRequest, format, args...)
}

func invalidGrant(format string, args ...any) *Error {
	return oauthErr(http.StatusBadRequest, CodeInvalidGrant, format, args...)
}

func invalidClient(format string, args ...any) *Error {
	return oauthErr(http.StatusUnauthorized, CodeInvalidClient, format, args...)
}

// serverError hides the cause from the client; it is logged.
func serverError(cause error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: CodeServerError, Description: "internal error", cause: cause}
}

// dpopError maps a proof failure to its OAuth error at the authorization
// server (400; the resource server uses 401, see Authenticate).
func dpopError(err error) *Error {
	if errors.Is(err, dpop.ErrUseNonce) {
		return &Error{Status: http.StatusBadRequest, Code: CodeUseDPoPNonce, Description: "Authorization server requires nonce in DPoP proof", cause: err}
	}
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidDPoP, Description: err.Error(), cause: err}
}

// asError turns any error into an *Error, treating unknown ones as
// server faults.
func asError(err error) *Error {
	var oe *Error
	if errors.As(err, &oe) {
		return oe
	}
	return serverError(err)
}

// writeJSON writes a JSON response that must not be cached. It carries
// its length, so that the client has the whole answer at once even when
// the connection is then held (a refusal's cool-off).
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"server_error"}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// answer writes the outcome of a request to one of the JSON endpoints:
// res with status, or the error. Either carries the current DPoP nonce.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, status int, res any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("DPoP-Nonce", s.dpop.Nonce())
	writeJSON(w, status, res)
}

// writeError writes an OAuth JSON error, logging server faults. Every
// response of the JSON endpoints carries the current DPoP nonce.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	oe := asError(err)
	if oe.Status >= 500 && oe.Code != CodeUnavailable {
		s.log.Error("oauth request failed", "path", r.URL.Path, "err", err)
	} else {
		s.log.Debug("oauth request refused", "path", r.URL.Path, "code", oe.Code, "err", err)
	}
	w.Header().Set("DPoP-Nonce", s.dpop.Nonce())
	if oe.retryAfter > 0 {
		w.Header().Set(ratelimit.HeaderRetryAfter, strconv.FormatInt(ratelimit.RetryAfterSeconds(oe.retryAfter), 10))
	}
	writeJSON(w, oe.Status, map[string]string{"error": oe.Code, "error_description": oe.Description})
}
