package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Domain errors. Translate is the one place driver errors become these, so
// callers above the storage layer test with errors.Is and never import pgx.
var (
	// ErrNotFound means a query expected a row and found none.
	ErrNotFound = errors.New("db: not found")
	// ErrConflict means a unique constraint rejected the write.
	ErrConflict = errors.New("db: conflict")
	// ErrSerialization means Postgres aborted the transaction to keep it
	// serialisable (or to break a deadlock); retrying it may succeed.
	ErrSerialization = errors.New("db: serialization failure")
	// ErrInvalidText means Postgres refused a string it cannot store: a
	// NUL character or bytes that are not UTF-8 in a text column, or a
	// \u0000 in a jsonb one. Such strings come from clients, so this is
	// their mistake; the statement wrote nothing.
	ErrInvalidText = errors.New("db: text cannot be stored (NUL character or invalid UTF-8)")
	// ErrSessionRefused means the session guard (bulwark_refuse_session,
	// migrations/00009_session_guard.sql) aborted a write: the account is
	// not active or the access token's session has ended.
	ErrSessionRefused = errors.New("db: session refused")
	// ErrRootMoved means a repository's root was not at the commit a write
	// was built on (SQLSTATE BW001, raised by bulwark_commit): another
	// writer moved it first, and nothing of the write was stored.
	ErrRootMoved = errors.New("db: repository root moved")
	// ErrFenced means a lease holder's write was refused because another
	// node has taken the lease over since (SQLSTATE BW003, raised by
	// bulwark_sequence): nothing was written.
	ErrFenced = errors.New("db: lease taken over by another node")
	// ErrUnavailable means the database could not be reached or went away
	// in the middle of a statement: the connection failed, the server is
	// shutting down or refusing connections (a failover), or the server
	// reached is a read-only standby. Whether a transaction cut off this
	// way committed is unknown to the caller, but it committed whole or
	// not at all; a retry after a moment reaches the new primary.
	ErrUnavailable = errors.New("db: database unavailable")
)

// translated are the errors Translate returns wrapped; an error that
// already wraps one of them has been translated.
var translated = []error{ErrNotFound, ErrConflict, ErrSerialization, ErrInvalidText, ErrSessionRefused, ErrRootMoved, ErrFenced, ErrUnavailable}

// sqlStates maps the SQLSTATE codes Translate understands to their domain
// error.
var sqlStates = map[string]error{
	"23505": ErrConflict,       // unique_violation
	"40001": ErrSerialization,  // serialization_failure
	"40P01": ErrSerialization,  // deadlock_detected
	"22021": ErrInvalidText,    // character_not_in_repertoire (NUL, invalid UTF-8 in text)
	"22P05": ErrInvalidText,    // untranslatable_character (\u0000 in jsonb)
	"BW002": ErrSessionRefused, // raised by bulwark_refuse_session
	"BW001": ErrRootMoved,      // raised by bulwark_commit
	"BW003": ErrFenced,         // raised by bulwark_sequence
	"25006": ErrUnavailable,    // read_only_sql_transaction: a standby (before or after a failover)
	"57P01": ErrUnavailable,    // admin_shutdown: the server is stopping
	"25P03": ErrUnavailable,    // idle_in_transaction_session_timeout: the session was ended
	"57P02": ErrUnavailable,    // crash_shutdown
	"57P03": ErrUnavailable,    // cannot_connect_now: starting up, or in recovery
	"08000": ErrUnavailable,    // connection_exception
	"08003": ErrUnavailable,    // connection_does_not_exist
	"08006": ErrUnavailable,    // connection_failure
	"08001": ErrUnavailable,    // sqlclient_unable_to_establish_sqlconnection
	"08004": ErrUnavailable,    // sqlserver_rejected_establishment_of_sqlconnection
}

// Translate wraps err so that errors.Is(err, ErrNotFound / ErrConflict /
// ErrSerialization / ErrInvalidText / ErrSessionRefused / ErrRootMoved /
// ErrFenced / ErrUnavailable) works while the driver error stays reachable
// (for its detail and constraint name). nil stays nil; other errors come
// back unchanged, as do errors Translate has already wrapped.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	for _, sentinel := range translated {
		if errors.Is(err, sentinel) {
			return err
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if sentinel, ok := sqlStates[pgErr.Code]; ok {
			return fmt.Errorf("%w: %w", sentinel, err)
		}
		return err
	}
	if connectionLost(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// connectionLost reports whether err is the driver's report of a
// connection that could not be made or broke (as opposed to the caller's
// context ending, or an answer from the server).
func connectionLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	// pgconn's network errors (failed to write, failed to receive, ...)
	// say whether a retry is safe; nothing else in the code does.
	var netErr interface{ SafeToRetry() bool }
	return errors.As(err, &netErr)
}

// TranslateCall is Translate for an error that a database call itself
// returned (not one from anywhere in a handler): a pipeline's results
// report a connection that broke as the bare read or write error
// (io.ErrUnexpectedEOF, a reset), which from a database call can only
// mean that the connection is gone, so it becomes ErrUnavailable too. The
// caller's own context ending stays what it is.
func TranslateCall(err error) error {
	err = Translate(err)
	if err == nil || FromServer(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	for _, sentinel := range translated {
		if errors.Is(err, sentinel) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// ConstraintName is the name of the constraint a translated ErrConflict
// names (a unique index), or "" when err carries none.
func ConstraintName(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.ConstraintName
	}
	return ""
}

// FromServer reports whether err is an answer from the Postgres server (a
// statement it refused, which rolled its transaction back), as opposed to a
// failure of the connection or of the client, after which whether the
// transaction committed is unknown.
func FromServer(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}
