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
	// ErrRootMoved means a repository's root was not at the commit a write
	// was built on (SQLSTATE BW001, raised by bulwark_swap_root and
	// bulwark_commit): another writer moved it first, and nothing of the
	// write was stored.
	ErrRootMoved = errors.New("db: repository root moved")
)

// SQLSTATE codes Translate understands.
const (
	codeUniqueViolation      = "23505"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeRootMoved            = "BW001"
)

// Translate wraps err so that errors.Is(err, ErrNotFound / ErrConflict /
// ErrSerialization / ErrRootMoved) works while the driver error stays
// reachable (for its detail and constraint name). nil stays nil; other
// errors come back unchanged, as do errors Translate has already wrapped.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrSerialization) || errors.Is(err, ErrRootMoved) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeUniqueViolation:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case codeSerializationFailure, codeDeadlockDetected:
			return fmt.Errorf("%w: %w", ErrSerialization, err)
		case codeRootMoved:
			return fmt.Errorf("%w: %w", ErrRootMoved, err)
		}
	}
	return err
}

// FromServer reports whether err is an answer from the Postgres server (a
// statement it refused, which rolled its transaction back), as opposed to a
// failure of the connection or of the client, after which whether the
// transaction committed is unknown.
func FromServer(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}
