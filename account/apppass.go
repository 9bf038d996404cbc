package account

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// App password limits.
const (
	MaxAppPasswords         = 50
	MaxAppPasswordNameChars = 64
)

// appPasswordRE is the shape of a generated app password (xxxx-xxxx-xxxx-xxxx,
// as the reference PDS makes them). Only passwords of this shape are looked
// up as app passwords, so an ordinary login costs one hash.
var appPasswordRE = regexp.MustCompile(`^[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}$`)

func looksLikeAppPassword(pw string) bool { return appPasswordRE.MatchString(pw) }

const appPasswordAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

func generateAppPassword() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	var sb strings.Builder
	for i, c := range b {
		if i > 0 && i%4 == 0 {
			sb.WriteByte('-')
		}
		sb.WriteByte(appPasswordAlphabet[int(c)%len(appPasswordAlphabet)])
	}
	return sb.String()
}

// AppPassword is an app password; Password is set only when it is created.
type AppPassword struct {
	Name       string
	Password   string
	Privileged bool
	CreatedAt  time.Time
}

// CreateAppPassword makes a new app password for did.
func (s *Service) CreateAppPassword(ctx context.Context, did syntax.DID, name string, privileged bool) (*AppPassword, error) {
	name = strings.TrimSpace(name)
	if name == "" || utf8.RuneCountInString(name) > MaxAppPasswordNameChars {
		return nil, ruleErr(ErrInvalidAppPassword, "app password name must be 1 to %d characters", MaxAppPasswordNameChars)
	}
	pw := generateAppPassword()
	h, err := s.hash.appPasswordHash(ctx, did.String(), pw)
	if err != nil {
		return nil, err
	}
	ap := &AppPassword{Name: name, Password: pw, Privileged: privileged}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, qCountAppPasswords, did.String()).Scan(&n); err != nil {
			return db.Translate(err)
		}
		if n >= MaxAppPasswords {
			return ruleErr(ErrInvalidAppPassword, "an account may have at most %d app passwords; revoke one first", MaxAppPasswords)
		}
		err := tx.QueryRow(ctx, qInsertAppPassword, did.String(), name, h, privileged).Scan(&ap.CreatedAt)
		if err = db.Translate(err); errors.Is(err, db.ErrConflict) {
			return ruleErr(ErrAppPasswordExists, "an app password named %q already exists", name)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return ap, nil
}

func (s *Service) findAppPassword(ctx context.Context, did syntax.DID, pw string) (*AppPasswordInfo, error) {
	h, err := s.hash.appPasswordHash(ctx, did.String(), pw)
	if err != nil {
		return nil, err
	}
	var info AppPasswordInfo
	err = db.Translate(s.pool.QueryRow(ctx, qFindAppPassword, did.String(), h).Scan(&info.Name, &info.Privileged))
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up app password: %w", err)
	}
	return &info, nil
}

// ListAppPasswords lists did's app passwords, newest first, without the
// passwords.
func (s *Service) ListAppPasswords(ctx context.Context, did syntax.DID) ([]AppPassword, error) {
	rows, err := s.pool.Query(ctx, qListAppPasswords, did.String())
	if err != nil {
		return nil, db.Translate(err)
	}
	var out []AppPassword
	var ap AppPassword
	_, err = pgx.ForEachRow(rows, []any{&ap.Name, &ap.Privileged, &ap.CreatedAt}, func() error {
		out = append(out, ap)
		return nil
	})
	return out, db.Translate(err)
}

// RevokeAppPassword deletes an app password and ends its sessions.
func (s *Service) RevokeAppPassword(ctx context.Context, did syntax.DID, name string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, qDeleteAppPassword, did.String(), name)
		if err != nil {
			return db.Translate(err)
		}
		if tag.RowsAffected() == 0 {
			return ruleErr(ErrAppPasswordNotFound, "no app password named %q", name)
		}
		_, err = tx.Exec(ctx, qDeleteAppPasswordSessions, did.String(), name)
		return db.Translate(err)
	})
}
