package account

import (
	"errors"
	"fmt"
)

// Sentinel errors. The pds package maps each to an XRPC error name.
var (
	// ErrInvalidHandle means the handle is malformed or breaks a local rule
	// (length, characters). The wrapping message says which.
	ErrInvalidHandle = errors.New("invalid handle")
	// ErrUnsupportedDomain means the handle is not under one of the
	// server's handle domains.
	ErrUnsupportedDomain = errors.New("handle domain not supported")
	// ErrHandleNotAvailable means the handle is taken or reserved.
	ErrHandleNotAvailable = errors.New("handle not available")
	// ErrInvalidEmail means the email address is missing or malformed.
	ErrInvalidEmail = errors.New("invalid email")
	// ErrEmailTaken means another account uses the email address.
	ErrEmailTaken = errors.New("email already taken")
	// ErrInvalidPassword means a new password breaks the password rules.
	ErrInvalidPassword = errors.New("invalid password")
	// ErrInvalidInviteCode means the invite code is missing, unknown,
	// disabled or used up.
	ErrInvalidInviteCode = errors.New("invalid invite code")
	// ErrUnsupportedDID means the request asked to bring its own DID, which
	// this server does not support yet.
	ErrUnsupportedDID = errors.New("bringing an existing DID is not supported")
	// ErrAuthFailed means the identifier or password is wrong. It never
	// says which, so it cannot be used to probe for accounts.
	ErrAuthFailed = errors.New("invalid identifier or password")
	// ErrAccountNotFound means no account has that DID, handle or email.
	ErrAccountNotFound = errors.New("account not found")
	// ErrAccountDeactivated means the account is deactivated and the
	// operation needs an active one.
	ErrAccountDeactivated = errors.New("account is deactivated")
	// ErrAccountTakendown means the account has been taken down.
	ErrAccountTakendown = errors.New("account has been taken down")
	// ErrExpiredToken means a session token is past its expiry.
	ErrExpiredToken = errors.New("token has expired")
	// ErrInvalidToken means a session token does not verify, is of the
	// wrong type, or belongs to a session that has ended.
	ErrInvalidToken = errors.New("invalid token")
	// ErrAppPasswordExists means the account already has an app password
	// with that name.
	ErrAppPasswordExists = errors.New("app password name already in use")
	// ErrAppPasswordNotFound means no app password has that name.
	ErrAppPasswordNotFound = errors.New("app password not found")
	// ErrInvalidRecoveryKey means createAccount's recoveryKey is not a
	// did:key of a K-256 or P-256 public key.
	ErrInvalidRecoveryKey = errors.New("invalid recovery key")
	// ErrInvalidAppPassword means an app password name breaks the rules,
	// or the account has as many app passwords as allowed.
	ErrInvalidAppPassword = errors.New("invalid app password request")
)

// ruleError gives a sentinel a human message: errors.Is sees the sentinel,
// Error() is the message alone, so handlers can pass it to the client.
type ruleError struct {
	sentinel error
	msg      string
}

func (e *ruleError) Error() string { return e.msg }
func (e *ruleError) Unwrap() error { return e.sentinel }

func ruleErr(sentinel error, format string, args ...any) error {
	return &ruleError{sentinel: sentinel, msg: fmt.Sprintf(format, args...)}
}
