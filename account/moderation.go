package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bulwark-pds/bulwark/db"
)

// Moderation state for administrators (com.atproto.admin.*): takedowns of
// records and blobs, the refs of account takedowns, invite notes, and the
// admin view of invites. Kept apart from queries.sql so the admin surface
// reads as one piece.

//go:embed moderation.sql
var moderationSQL string

var (
	moderationQueries       = db.MustParseQueries(moderationSQL)
	qPutTakedown            = moderationQueries.MustGet("PutTakedown")
	qDeleteTakedown         = moderationQueries.MustGet("DeleteTakedown")
	qGetTakedown            = moderationQueries.MustGet("GetTakedown")
	qTakendownRecordKeys    = moderationQueries.MustGet("TakendownRecordKeys")
	qSetInviteNote          = moderationQueries.MustGet("SetInviteNote")
	qInviteNotes            = moderationQueries.MustGet("InviteNotes")
	qInviteCodesFor         = moderationQueries.MustGet("InviteCodesFor")
	qInviteCodesByCode      = moderationQueries.MustGet("InviteCodesByCode")
	qInvitesUsedBy          = moderationQueries.MustGet("InvitesUsedBy")
	qListInviteCodesByUsage = moderationQueries.MustGet("ListInviteCodesByUsage")
)

// Querier is what the moderation functions need: a pgx.Tx (to change state
// together with an audit entry) or the pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// TxFunc is work done inside the transaction of an account change.
type TxFunc func(ctx context.Context, tx pgx.Tx) error

// WriteOption adjusts an account change (SetStatus, UpdateHandle, Delete,
// SetPassword, SetEmail, SetInvitesDisabled, DisableInviteCodes).
type WriteOption func(*writeOptions)

type writeOptions struct {
	also []TxFunc
}

// Also runs fn inside the change's transaction, after the change, even
// when the change turned out to be a no-op; an error from fn rolls the
// change back. Admin handlers write their audit entry this way, so the
// audit log and the change commit or fail together.
func Also(fn TxFunc) WriteOption {
	return func(o *writeOptions) { o.also = append(o.also, fn) }
}

func runAlso(ctx context.Context, tx pgx.Tx, opts []WriteOption) error {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	for _, fn := range o.also {
		if err := fn(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}

// TakedownKind is what a takedown applies to.
type TakedownKind string

// Takedown kinds.
const (
	TakedownAccount TakedownKind = "account"
	TakedownRecord  TakedownKind = "record"
	TakedownBlob    TakedownKind = "blob"
)

// Takedown is an administrator's takedown of an account, a record or a
// blob.
type Takedown struct {
	DID  syntax.DID
	Kind TakedownKind
	// Subject is "" for an account, collection/rkey for a record, and the
	// CID for a blob.
	Subject string
	// CID is the record CID the administrator named, if any.
	CID string
	// Ref is the administrator's reference (a moderation report, a ticket).
	Ref       string
	CreatedAt time.Time
}

// RecordSubject is the Subject of a record's takedown.
func RecordSubject(collection syntax.NSID, rkey syntax.RecordKey) string {
	return collection.String() + "/" + rkey.String()
}

// PutTakedown records t, replacing the CID and ref of an existing takedown
// of the same subject (so repeating a takedown is harmless). The account
// must exist.
func PutTakedown(ctx context.Context, q Querier, t *Takedown) error {
	if _, err := q.Exec(ctx, qPutTakedown, t.DID.String(), string(t.Kind), t.Subject, t.CID, t.Ref); err != nil {
		return fmt.Errorf("recording takedown: %w", db.Translate(err))
	}
	return nil
}

// RemoveTakedown reverses a takedown and reports whether there was one.
func RemoveTakedown(ctx context.Context, q Querier, did syntax.DID, kind TakedownKind, subject string) (bool, error) {
	tag, err := q.Exec(ctx, qDeleteTakedown, did.String(), string(kind), subject)
	if err != nil {
		return false, fmt.Errorf("reversing takedown: %w", db.Translate(err))
	}
	return tag.RowsAffected() > 0, nil
}

// GetTakedown returns the takedown of a subject, or nil when there is none.
func GetTakedown(ctx context.Context, q Querier, did syntax.DID, kind TakedownKind, subject string) (*Takedown, error) {
	t := &Takedown{DID: did, Kind: kind, Subject: subject}
	err := q.QueryRow(ctx, qGetTakedown, did.String(), string(kind), subject).Scan(&t.CID, &t.Ref, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading takedown: %w", db.Translate(err))
	}
	return t, nil
}

// RecordTakendown reports whether an administrator took the record down.
func RecordTakendown(ctx context.Context, q Querier, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) (bool, error) {
	t, err := GetTakedown(ctx, q, did, TakedownRecord, RecordSubject(collection, rkey))
	return t != nil, err
}

// TakendownRecordKeys returns the record keys of collection that an
// administrator took down (usually none).
func TakendownRecordKeys(ctx context.Context, q Querier, did syntax.DID, collection syntax.NSID) (map[string]bool, error) {
	rows, err := q.Query(ctx, qTakendownRecordKeys, did.String(), collection.String())
	if err != nil {
		return nil, fmt.Errorf("reading takedowns: %w", db.Translate(err))
	}
	var out map[string]bool
	var subject string
	_, err = pgx.ForEachRow(rows, []any{&subject}, func() error {
		if out == nil {
			out = map[string]bool{}
		}
		out[strings.TrimPrefix(subject, collection.String()+"/")] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading takedowns: %w", db.Translate(err))
	}
	return out, nil
}

// BlobTakendown reports whether an administrator took the blob down.
func BlobTakendown(ctx context.Context, q Querier, did syntax.DID, cid string) (bool, error) {
	t, err := GetTakedown(ctx, q, did, TakedownBlob, cid)
	return t != nil, err
}

// EndSessions ends every session of did, as a takedown does: reversing the
// takedown must not bring back sessions someone may have abused.
func EndSessions(ctx context.Context, q Querier, did syntax.DID) error {
	_, err := q.Exec(ctx, qDeleteAllSessions, did.String())
	return db.Translate(err)
}

// SetInviteNote stores the administrator's note on did's invites.
func SetInviteNote(ctx context.Context, q Querier, did syntax.DID, note string) error {
	tag, err := q.Exec(ctx, qSetInviteNote, did.String(), note)
	if err != nil {
		return db.Translate(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrAccountNotFound
	}
	return nil
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
