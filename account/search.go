package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed search.sql
var searchSQL string

var (
	searchQueries          = db.MustParseQueries(searchSQL)
	qCountAccountsByStatus = searchQueries.MustGet("CountAccountsByStatus")
	qSearchAccounts        = searchQueries.MustGet("SearchAccounts")
)

// ErrInvalidSearch means a Search's text is too long or its status is not
// one an account can be in.
var ErrInvalidSearch = errors.New("invalid account search")

// Bounds of Search.
const (
	// MaxSearchText bounds the text searched for.
	MaxSearchText = 256
	// MaxSearchResults bounds one search's answer.
	MaxSearchResults = 200
)

// Search selects accounts for an administrator. The zero value lists the
// newest accounts.
type Search struct {
	// Text is matched against the DID (exactly), and the handle and email
	// (as a part, ignoring case). Empty matches every account.
	Text string
	// Status keeps only accounts in that status (empty: any).
	Status Status
	// Limit bounds the answer (default 50, at most MaxSearchResults).
	Limit int
}

// SearchAccounts returns the accounts matching q, newest first. Text
// longer than MaxSearchText, or an unknown status, is ErrInvalidSearch.
func (s *Service) SearchAccounts(ctx context.Context, q Search) ([]*Account, error) {
	text := strings.ToLower(strings.TrimSpace(q.Text))
	if len(text) > MaxSearchText {
		return nil, ruleErr(ErrInvalidSearch, "search text is longer than %d bytes", MaxSearchText)
	}
	switch q.Status {
	case "", StatusActive, StatusDeactivated, StatusTakendown:
	default:
		return nil, ruleErr(ErrInvalidSearch, "unknown account status %q", q.Status)
	}
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, MaxSearchResults)
	pattern := ""
	if text != "" {
		pattern = "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(text) + "%"
	}
	rows, err := s.pool.Query(ctx, qSearchAccounts, text, pattern, string(q.Status), q.Limit)
	if err != nil {
		return nil, fmt.Errorf("searching accounts: %w", db.Translate(err))
	}
	defer rows.Close()
	var out []*Account
	for rows.Next() {
		a, err := s.scanAccount(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, db.Translate(rows.Err())
}

// CountByStatus counts the hosted accounts in each status.
func (s *Service) CountByStatus(ctx context.Context) (map[Status]int64, error) {
	rows, err := s.pool.Query(ctx, qCountAccountsByStatus)
	if err != nil {
		return nil, fmt.Errorf("counting accounts: %w", db.Translate(err))
	}
	defer rows.Close()
	out := map[Status]int64{}
	for rows.Next() {
		var status string
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			return nil, fmt.Errorf("counting accounts: %w", db.Translate(err))
		}
		out[Status(status)] = n
	}
	return out, db.Translate(rows.Err())
}
