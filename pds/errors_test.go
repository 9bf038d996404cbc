package pds

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/repo"
)

// TestXRPCErrorFor: each domain error, wrapped as the packages wrap them,
// is the named XRPC error the lexicons and clients expect, with the
// domain's message; anything else is a 500 that says nothing.
func TestXRPCErrorFor(t *testing.T) {
	t.Parallel()
	wrap := func(sentinel error) error { return fmt.Errorf("doing it: %w", sentinel) }
	cases := []struct {
		err    error
		status int
		name   string
	}{
		{wrap(eventlog.ErrNoEvent), http.StatusBadRequest, "EventNotFound"},
		{wrap(eventlog.ErrNotRepairable), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrExpiredToken), http.StatusBadRequest, "ExpiredToken"},
		{wrap(account.ErrInvalidToken), http.StatusBadRequest, "InvalidToken"},
		{wrap(account.ErrAccountDeactivated), http.StatusUnauthorized, "AccountDeactivated"},
		{wrap(account.ErrAccountTakendown), http.StatusUnauthorized, "AccountTakedown"},
		{wrap(account.ErrAuthFailed), http.StatusUnauthorized, "AuthenticationRequired"},
		{wrap(account.ErrInvalidHandle), http.StatusBadRequest, "InvalidHandle"},
		{wrap(account.ErrUnsupportedDomain), http.StatusBadRequest, "UnsupportedDomain"},
		{wrap(account.ErrHandleNotAvailable), http.StatusBadRequest, "HandleNotAvailable"},
		{wrap(account.ErrInvalidPassword), http.StatusBadRequest, "InvalidPassword"},
		{wrap(account.ErrInvalidInviteCode), http.StatusBadRequest, "InvalidInviteCode"},
		{wrap(account.ErrInvalidEmail), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrEmailTaken), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrUnsupportedDID), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrAppPasswordExists), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrInvalidAppPassword), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrAppPasswordNotFound), http.StatusBadRequest, "InvalidRequest"},
		{wrap(account.ErrAccountNotFound), http.StatusBadRequest, "AccountNotFound"},
		{wrap(repo.ErrInvalidSwap), http.StatusBadRequest, "InvalidSwap"},
		{wrap(repo.ErrRecordNotFound), http.StatusBadRequest, "RecordNotFound"},
		{wrap(repo.ErrRepoNotFound), http.StatusBadRequest, "RepoNotFound"},
		{wrap(repo.ErrRecordExists), http.StatusBadRequest, "InvalidRequest"},
		{wrap(repo.ErrInvalidWrite), http.StatusBadRequest, "InvalidRequest"},
		{wrap(plc.ErrNotControlled), http.StatusBadRequest, "InvalidRequest"},
		{wrap(blob.ErrBlobNotFound), http.StatusBadRequest, "BlobNotFound"},
		{wrap(&blob.TooLargeError{Max: 10}), http.StatusRequestEntityTooLarge, "PayloadTooLarge"},
	}
	for _, c := range cases {
		xe := xrpcErrorFor(c.err)
		require.Equal(t, c.status, xe.Status, "%v", c.err)
		require.Equal(t, c.name, xe.Name, "%v", c.err)
		require.Equal(t, c.err.Error(), xe.Message, "the domain's message is the client's")
	}

	// A record over its limit names the limit, not the wrapping.
	le := &repo.LimitError{Limit: repo.LimitRecordCBOR, Path: "app.bsky.feed.post/x", Size: 2_000_000, Max: 1_000_000}
	xe := xrpcErrorFor(fmt.Errorf("commit: %w: %w", repo.ErrLimitExceeded, le))
	require.Equal(t, "InvalidRequest", xe.Name)
	require.Equal(t, le.Error(), xe.Message)

	// A PLC directory failure is a 502 that keeps its cause for the log.
	cause := fmt.Errorf("%w: 500 from the directory", plc.ErrDirectory)
	xe = xrpcErrorFor(cause)
	require.Equal(t, http.StatusBadGateway, xe.Status)
	require.Equal(t, "UpstreamFailure", xe.Name)
	require.ErrorIs(t, xe, cause)
	require.NotContains(t, xe.Message, "500 from the directory")

	xe = xrpcErrorFor(fmt.Errorf("%w: connection reset", blob.ErrUploadRead))
	require.Equal(t, "InvalidRequest", xe.Name)
	require.Contains(t, xe.Message, "did not arrive whole")

	// The budget's refusal carries its Retry-After.
	xe = xrpcErrorFor(fmt.Errorf("getRepo: %w", &budget.OverloadedError{RetryAfter: 7 * time.Second}))
	require.Equal(t, http.StatusServiceUnavailable, xe.Status)
	require.Equal(t, "ServiceOverloaded", xe.Name)
	require.Equal(t, []string{"7"}, xe.Header.Values("Retry-After"))

	// So do full password-hash slots.
	xe = xrpcErrorFor(fmt.Errorf("login: %w", account.ErrPasswordBusy))
	require.Equal(t, http.StatusServiceUnavailable, xe.Status)
	require.Equal(t, "ServiceOverloaded", xe.Name)
	require.Equal(t, []string{"1"}, xe.Header.Values("Retry-After"))

	// Text Postgres refuses, even when no storage function translated it.
	for _, code := range []string{"22021", "22P05"} {
		xe = xrpcErrorFor(fmt.Errorf("storing: %w", &pgconn.PgError{Code: code, Message: "invalid byte sequence"}))
		require.Equal(t, http.StatusBadRequest, xe.Status, code)
		require.Equal(t, "InvalidRequest", xe.Name, code)
		require.NotContains(t, xe.Message, "invalid byte sequence", "the driver's words stay in the log")
	}

	// An XRPC error passes through; a body over its limit is 413; the rest
	// is a 500 with a generic message and the cause for the log.
	own := RecordNotFound("gone")
	require.Same(t, own, xrpcErrorFor(fmt.Errorf("wrapped: %w", own)))
	require.Equal(t, http.StatusRequestEntityTooLarge, xrpcErrorFor(&http.MaxBytesError{Limit: 5}).Status)
	for _, err := range []error{errors.New("disk on fire"), fmt.Errorf("read: %w", db.ErrNotFound), &pgconn.PgError{Code: "42601"}} {
		xe = xrpcErrorFor(err)
		require.Equal(t, http.StatusInternalServerError, xe.Status, "%v", err)
		require.Equal(t, "internal server error", xe.Message)
		require.ErrorIs(t, xe, err)
	}
}
