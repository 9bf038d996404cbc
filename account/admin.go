package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
)

// Methods for administrators (com.atproto.admin.*): no session checks here;
// the caller has checked the admin credentials.

// GetMany returns the accounts among dids, in DID order; unknown DIDs are
// left out.
func (s *Service) GetMany(ctx context.Context, dids []syntax.DID) ([]*Account, error) {
	raw := make([]string, len(dids))
	for i, d := range dids {
		raw[i] = d.String()
	}
	rows, err := s.pool.Query(ctx, qGetAccountsByDID, raw)
	if err != nil {
		return nil, db.Translate(err)
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

// InvitedBy returns the invite code did's account was created with, or "".
func (s *Service) InvitedBy(ctx context.Context, did syntax.DID) (string, error) {
	var code string
	err := db.Translate(s.pool.QueryRow(ctx, qInviteUsedBy, did.String()).Scan(&code))
	if errors.Is(err, db.ErrNotFound) {
		return "", nil
	}
	return code, err
}

// SetPassword replaces did's password (com.atproto.admin.updateAccountPassword)
// and, in the same transaction, ends everything the old one let anybody
// do: every session, every app password and every mailed code (see
// replacePassword). A reset is usually because the old one leaked.
func (s *Service) SetPassword(ctx context.Context, did syntax.DID, password string, opts ...WriteOption) error {
	h, err := s.newPasswordHash(ctx, password)
	if err != nil {
		return err
	}
	if err := s.setPasswordHash(ctx, did, h, opts...); err != nil {
		return err
	}
	s.log.Info("password replaced; sessions, app passwords and mailed codes revoked", "did", did)
	return nil
}

// SetEmail replaces did's email address (com.atproto.admin.updateAccountEmail).
// A new address is unconfirmed and the codes mailed to the old one stop
// working; setting the current address again changes nothing.
func (s *Service) SetEmail(ctx context.Context, did syntax.DID, email string, opts ...WriteOption) error {
	email, err := normalizeEmail(email)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := lockEmail(ctx, tx, did)
		if err != nil {
			return err
		}
		if err := runFirst(ctx, tx, opts); err != nil {
			return err
		}
		if err := s.replaceEmail(ctx, tx, did, cur, email); err != nil {
			return err
		}
		return runAlso(ctx, tx, opts)
	})
}

// SetInvitesDisabled turns did's ability to make invite codes off or on
// and, when note is not nil, stores the administrator's note on its
// invites.
func (s *Service) SetInvitesDisabled(ctx context.Context, did syntax.DID, disabled bool, note *string, opts ...WriteOption) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, qSetInvitesDisabled, did.String(), disabled)
		if err != nil {
			return db.Translate(err)
		}
		if tag.RowsAffected() == 0 {
			return ErrAccountNotFound
		}
		if note != nil {
			if _, err := tx.Exec(ctx, qSetInviteNote, did.String(), *note); err != nil {
				return db.Translate(err)
			}
		}
		return runAlso(ctx, tx, opts)
	})
}

// ListInviteCodes pages through every invite code, newest first. cursor is
// the last code of the previous page ("" to start); the returned cursor is
// "" at the end.
func (s *Service) ListInviteCodes(ctx context.Context, cursor string, limit int) ([]InviteCode, string, error) {
	return s.listInviteCodes(ctx, qListInviteCodes, cursor, limit)
}

// listInviteCodes runs one of the invite-code page queries (cursor, limit).
func (s *Service) listInviteCodes(ctx context.Context, query, cursor string, limit int) ([]InviteCode, string, error) {
	if limit < 1 {
		return nil, "", fmt.Errorf("account: limit must be positive")
	}
	rows, err := s.pool.Query(ctx, query, cursor, limit)
	if err != nil {
		return nil, "", db.Translate(err)
	}
	out, err := scanInviteCodes(rows)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) == limit {
		next = out[len(out)-1].Code
	}
	return out, next, nil
}

// DisableInviteCodes disables the given codes and every code made for the
// given accounts. e, when not nil, is recorded in the audit log in the
// same transaction, with the codes it disabled (Before enabled, After
// disabled).
func (s *Service) DisableInviteCodes(ctx context.Context, codes []string, accounts []string, e *audit.Entry) error {
	if codes == nil {
		codes = []string{}
	}
	if accounts == nil {
		accounts = []string{}
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, qDisableInviteCodes, codes, accounts)
		if err != nil {
			return db.Translate(err)
		}
		changed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return db.Translate(err)
		}
		if e == nil {
			return nil
		}
		if changed == nil {
			changed = []string{}
		}
		e.Before = map[string]any{"codes": changed, "disabled": false}
		e.After = map[string]any{"codes": changed, "disabled": true, "asked": map[string]any{"codes": codes, "accounts": accounts}}
		return audit.Record(ctx, tx, e)
	})
}

// PasswordAudited records e for a password change (SetPassword) in its
// transaction, with what the change ends: Before the account's live
// sessions and app passwords, read before the change; After none of them.
// The password itself never reaches the log.
func PasswordAudited(did syntax.DID, e *audit.Entry) WriteOption {
	return func(o *writeOptions) {
		o.first = append(o.first, func(ctx context.Context, tx db.DBTX) error {
			var sessions, apps int64
			if err := tx.QueryRow(ctx, qCountCredentials, did.String()).Scan(&sessions, &apps); err != nil {
				return db.Translate(err)
			}
			e.Before = map[string]any{"sessions": sessions, "appPasswords": apps}
			return nil
		})
		o.also = append(o.also, func(ctx context.Context, tx db.DBTX) error {
			e.After = map[string]any{"password": "changed", "sessions": 0, "appPasswords": 0}
			return audit.Record(ctx, tx, e)
		})
	}
}

func scanInviteCodes(rows pgx.Rows) ([]InviteCode, error) {
	var out []InviteCode
	var c InviteCode
	var usedBy []string
	var usedAt []time.Time
	_, err := pgx.ForEachRow(rows, []any{&c.Code, &c.Available, &c.Disabled, &c.ForAccount, &c.CreatedBy, &c.CreatedAt, &usedBy, &usedAt}, func() error {
		ic := c
		ic.Uses = nil
		for i := range usedBy {
			ic.Uses = append(ic.Uses, InviteUse{UsedBy: syntax.DID(usedBy[i]), UsedAt: usedAt[i]})
		}
		out = append(out, ic)
		return nil
	})
	return out, db.Translate(err)
}

// AdminDetails is what the admin account view shows beyond the Account.
type AdminDetails struct {
	// InvitedBy is the code the account was created with, or nil.
	InvitedBy *InviteCode
	// Invites are the codes made for the account, newest first.
	Invites    []InviteCode
	InviteNote string
}

// AdminDetails returns the invite details of dids in four queries however
// many there are (getAccountInfos takes hundreds). Unknown DIDs get an
// empty entry.
func (s *Service) AdminDetails(ctx context.Context, dids []syntax.DID) (map[syntax.DID]*AdminDetails, error) {
	raw := make([]string, len(dids))
	out := make(map[syntax.DID]*AdminDetails, len(dids))
	for i, d := range dids {
		raw[i] = d.String()
		out[d] = &AdminDetails{}
	}
	var did, note, code string
	rows, err := s.pool.Query(ctx, qInviteNotes, raw)
	if err != nil {
		return nil, db.Translate(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&did, &note}, func() error {
		if d := out[syntax.DID(did)]; d != nil {
			d.InviteNote = note
		}
		return nil
	}); err != nil {
		return nil, db.Translate(err)
	}

	rows, err = s.pool.Query(ctx, qInviteCodesFor, raw)
	if err != nil {
		return nil, db.Translate(err)
	}
	made, err := scanInviteCodes(rows)
	if err != nil {
		return nil, err
	}
	for _, c := range made {
		if d := out[syntax.DID(c.ForAccount)]; d != nil {
			d.Invites = append(d.Invites, c)
		}
	}

	rows, err = s.pool.Query(ctx, qInvitesUsedBy, raw)
	if err != nil {
		return nil, db.Translate(err)
	}
	usedBy := map[string][]syntax.DID{}
	if _, err := pgx.ForEachRow(rows, []any{&did, &code}, func() error {
		usedBy[code] = append(usedBy[code], syntax.DID(did))
		return nil
	}); err != nil {
		return nil, db.Translate(err)
	}
	if len(usedBy) == 0 {
		return out, nil
	}
	codes := make([]string, 0, len(usedBy))
	for c := range usedBy {
		codes = append(codes, c)
	}
	rows, err = s.pool.Query(ctx, qInviteCodesByCode, codes)
	if err != nil {
		return nil, db.Translate(err)
	}
	used, err := scanInviteCodes(rows)
	if err != nil {
		return nil, err
	}
	for i := range used {
		for _, d := range usedBy[used[i].Code] {
			if det := out[d]; det != nil {
				det.InvitedBy = &used[i]
			}
		}
	}
	return out, nil
}

// ListInviteCodesByUsage is ListInviteCodes ordered by how often each code
// was used, most first.
func (s *Service) ListInviteCodesByUsage(ctx context.Context, cursor string, limit int) ([]InviteCode, string, error) {
	return s.listInviteCodes(ctx, qListInviteCodesByUsage, cursor, limit)
}
