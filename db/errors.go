package db

import (
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
)

// translated are the errors Translate returns wrapped; an error that
// already wraps one of them has been translated.
var translated = []error{ErrNotFound, ErrConflict, ErrSerialization, ErrInvalidText, ErrSessionRefused, ErrRootMoved}

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
}

// Translate wraps err so that errors.Is(err, ErrNotFound / ErrConflict /
// ErrSerialization / ErrInvalidText / ErrSessionRefused / ErrRootMoved) works while the
// driver error stays reachable (for its detail and constraint name). nil
// stays nil; other errors come back unchanged, as do errors Translate has
// already wrapped.
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
	}
	return err
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
