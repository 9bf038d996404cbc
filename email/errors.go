package email

import "errors"

// Sentinel errors. The pds package maps the token and message errors to
// XRPC errors (InvalidToken, ExpiredToken, InvalidRequest).
var (
	// ErrTokenInvalid means no live code matches: wrong, already used,
	// replaced by a newer request, or never issued.
	ErrTokenInvalid = errors.New("token is invalid")
	// ErrTokenExpired means the code matches but is past its lifetime.
	ErrTokenExpired = errors.New("token is expired")
	// ErrInvalidPurpose means a token purpose outside the Purpose constants.
	ErrInvalidPurpose = errors.New("invalid token purpose")
	// ErrInvalidMessage means a message cannot be queued as given: a
	// malformed or overlong recipient, subject, content or handle, or an
	// unknown kind. The wrapping message says which.
	ErrInvalidMessage = errors.New("invalid email message")
	// ErrInvalidSMTPURL means BULWARK_SMTP_URL cannot be used.
	ErrInvalidSMTPURL = errors.New("invalid SMTP URL")
	// ErrInvalidConfig means a Config field other than the SMTP URL is
	// wrong (sender address, template directory).
	ErrInvalidConfig = errors.New("invalid email configuration")
	// ErrTemplate means a template (an operator's override) does not parse
	// or does not render with sample data.
	ErrTemplate = errors.New("email template")
)
