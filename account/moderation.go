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

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
)

// Moderation state for administrators (com.atproto.admin.*): takedowns of
// accounts, records and blobs, invite notes, and the admin view of
// invites. Kept apart from queries.sql so the admin surface reads as one
// piece. Every administrator's change is recorded in the audit log inside
// the transaction making it, so the log never disagrees with the state.

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

// TxFunc is work done inside the transaction of an account change.
type TxFunc func(ctx context.Context, tx db.DBTX) error

// WriteOption adjusts an account change (SetStatus, UpdateHandle, Delete,
// SetPassword, SetEmail, SetInvitesDisabled, DisableInviteCodes).
type WriteOption func(*writeOptions)

type writeOptions struct {
	first []TxFunc
	also  []TxFunc
	// resolver checks handles outside the server's domains
	// (ResolveHandlesWith).
	resolver HandleResolver
	// docs reads did:web documents (ResolveDIDsWith).
	docs DocResolver
	// anyHandle lifts the reserved names (AnyValidHandle).
	anyHandle bool
}

// ResolveHandlesWith lets UpdateHandle accept a handle outside the
// server's domains that r resolves to the account's DID (CheckHandle).
func ResolveHandlesWith(r HandleResolver) WriteOption {
	return func(o *writeOptions) { o.resolver = r }
}

// ResolveDIDsWith lets UpdateHandle read a did:web's document through d
// (a did:web account's handle must be declared by its document).
func ResolveDIDsWith(d DocResolver) WriteOption {
	return func(o *writeOptions) { o.docs = d }
}

// AnyValidHandle lets UpdateHandle give a reserved name under the
// server's domains (an administrator's change, as the reference PDS's
// allowAnyValid).
func AnyValidHandle() WriteOption {
	return func(o *writeOptions) { o.anyHandle = true }
}

// Also runs fn inside the change's transaction, after the change, even
// when the change turned out to be a no-op; an error from fn rolls the
// change back.
func Also(fn TxFunc) WriteOption {
	return func(o *writeOptions) { o.also = append(o.also, fn) }
}

// Audited records e in the audit log inside the change's transaction (as
// Also does), so the entry and the change commit or fail together. Admin
// methods record their writes this way.
func Audited(e *audit.Entry) WriteOption {
	return Also(func(ctx context.Context, tx db.DBTX) error { return audit.Record(ctx, tx, e) })
}

// runFirst runs the steps that must succeed before the change is made
// (a mailed code used up, see useEmailCode), inside its transaction.
func runFirst(ctx context.Context, tx db.DBTX, opts []WriteOption) error {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	for _, fn := range o.first {
		if err := fn(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}

func runAlso(ctx context.Context, tx db.DBTX, opts []WriteOption) error {
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

// StatusAttr is one status an administrator sets on a subject: applied or
// reversed, with their reference. Its JSON is the lexicon's
// com.atproto.admin.defs#statusAttr, which is how audit entries show it.
type StatusAttr struct {
	Applied bool    `json:"applied"`
	Ref     *string `json:"ref,omitempty"`
}

// RefString is the reference, or "".
func (a *StatusAttr) RefString() string {
	if a == nil || a.Ref == nil {
		return ""
	}
	return *a.Ref
}

// statusAttr is a StatusAttr whose ref is kept only while it applies.
func statusAttr(applied bool, ref string) *StatusAttr {
	a := &StatusAttr{Applied: applied}
	if applied && ref != "" {
		a.Ref = &ref
	}
	return a
}

// Moderation is an administrator's change to an account's status
// (com.atproto.admin.updateSubjectStatus naming an account). A nil field
// leaves that status alone.
type Moderation struct {
	// Takedown takes the account down, ending its sessions, or reverses a
	// takedown.
	Takedown *StatusAttr
	// Deactivated deactivates the account or reactivates it. It changes
	// nothing while the account is taken down.
	Deactivated *StatusAttr
}

// next is the status an account in status from moves to. Reversing a
// takedown of an account that is not taken down changes nothing (it must
// not reactivate a deactivated account).
func (m Moderation) next(from Status) Status {
	to := from
	if m.Takedown != nil {
		if m.Takedown.Applied {
			to = StatusTakendown
		} else if to == StatusTakendown {
			to = StatusActive
		}
	}
	if m.Deactivated != nil && to != StatusTakendown {
		if m.Deactivated.Applied {
			to = StatusDeactivated
		} else if to == StatusDeactivated {
			to = StatusActive
		}
	}
	return to
}

// ModerateAccount applies m to did's account in one transaction: the
// status change and its events (as SetStatus), the takedown's ref, the end
// of the account's sessions on a takedown (so that reversing it does not
// revive them), and the audit entry e, whose Before and After it fills in
// with the status before and after and the settings applied. With nothing
// to change it does nothing, not even look the account up.
func (s *Service) ModerateAccount(ctx context.Context, did syntax.DID, m Moderation, e *audit.Entry) error {
	if m.Takedown == nil && m.Deactivated == nil {
		return nil
	}
	return s.setStatus(ctx, did, m.next, func(ctx context.Context, tx db.DBTX, from, to Status) error {
		if t := m.Takedown; t != nil {
			if err := s.applyAccountTakedown(ctx, tx, did, t); err != nil {
				return err
			}
		}
		e.Before = map[string]any{"status": from}
		after := map[string]any{"status": to}
		if m.Takedown != nil {
			after["takedown"] = m.Takedown
		}
		if m.Deactivated != nil {
			after["deactivated"] = m.Deactivated
		}
		e.After = after
		return audit.Record(ctx, tx, e)
	}, nil)
}

// applyAccountTakedown keeps (or drops) the ref of did's takedown; applying
// one ends every session of did.
func (s *Service) applyAccountTakedown(ctx context.Context, tx db.DBTX, did syntax.DID, t *StatusAttr) error {
	if !t.Applied {
		_, err := removeTakedown(ctx, tx, did, TakedownAccount, "")
		return err
	}
	if err := putTakedown(ctx, tx, &Takedown{DID: did, Kind: TakedownAccount, Ref: t.RefString()}); err != nil {
		return err
	}
	return s.endAllSessions(ctx, tx, did)
}

// endAllSessions ends every session of did inside tx: its own refresh
// tokens (and so its access tokens) and those of Config.SessionEnders.
func (s *Service) endAllSessions(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	if _, err := tx.Exec(ctx, qDeleteAllSessions, did.String()); err != nil {
		return db.Translate(err)
	}
	for _, end := range s.cfg.SessionEnders {
		if err := end(ctx, tx, did); err != nil {
			return fmt.Errorf("ending sessions: %w", err)
		}
	}
	return nil
}

// SetTakedown takes a record or a blob down (applied, with t's CID and ref)
// or reverses its takedown, and records the change in the audit log as e,
// whose Before and After it fills in with the takedown's state, in one
// transaction. Repeating a takedown replaces its CID and ref. The account
// must exist.
func (s *Service) SetTakedown(ctx context.Context, t *Takedown, applied bool, e *audit.Entry) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		before, err := getTakedown(ctx, tx, t.DID, t.Kind, t.Subject)
		if err != nil {
			return err
		}
		if applied {
			err = putTakedown(ctx, tx, t)
		} else {
			_, err = removeTakedown(ctx, tx, t.DID, t.Kind, t.Subject)
		}
		if err != nil {
			return err
		}
		e.Before = map[string]any{"takedown": statusAttr(before != nil, before.refOrEmpty())}
		e.After = map[string]any{"takedown": statusAttr(applied, t.Ref)}
		return audit.Record(ctx, tx, e)
	})
}

func (t *Takedown) refOrEmpty() string {
	if t == nil {
		return ""
	}
	return t.Ref
}

// Takedown returns the takedown of a subject, or nil when there is none.
func (s *Service) Takedown(ctx context.Context, did syntax.DID, kind TakedownKind, subject string) (*Takedown, error) {
	return getTakedown(ctx, s.pool, did, kind, subject)
}

// RecordTakendown reports whether an administrator took the record down.
func (s *Service) RecordTakendown(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) (bool, error) {
	t, err := getTakedown(ctx, s.pool, did, TakedownRecord, RecordSubject(collection, rkey))
	return t != nil, err
}

// BlobTakendown reports whether an administrator took the blob down.
func (s *Service) BlobTakendown(ctx context.Context, did syntax.DID, cid string) (bool, error) {
	t, err := getTakedown(ctx, s.pool, did, TakedownBlob, cid)
	return t != nil, err
}

// TakendownRecordKeys returns the record keys of collection that an
// administrator took down (usually none).
func (s *Service) TakendownRecordKeys(ctx context.Context, did syntax.DID, collection syntax.NSID) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, qTakendownRecordKeys, did.String(), collection.String())
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

// putTakedown records t, replacing the CID and ref of an existing takedown
// of the same subject.
func putTakedown(ctx context.Context, q db.DBTX, t *Takedown) error {
	if _, err := q.Exec(ctx, qPutTakedown, t.DID.String(), string(t.Kind), t.Subject, t.CID, t.Ref); err != nil {
		return fmt.Errorf("recording takedown: %w", db.Translate(err))
	}
	return nil
}

// removeTakedown reverses a takedown and reports whether there was one.
func removeTakedown(ctx context.Context, q db.DBTX, did syntax.DID, kind TakedownKind, subject string) (bool, error) {
	tag, err := q.Exec(ctx, qDeleteTakedown, did.String(), string(kind), subject)
	if err != nil {
		return false, fmt.Errorf("reversing takedown: %w", db.Translate(err))
	}
	return tag.RowsAffected() > 0, nil
}

// getTakedown returns the takedown of a subject, or nil when there is none.
func getTakedown(ctx context.Context, q db.DBTX, did syntax.DID, kind TakedownKind, subject string) (*Takedown, error) {
	t := &Takedown{DID: did, Kind: kind, Subject: subject}
	err := db.Translate(q.QueryRow(ctx, qGetTakedown, did.String(), string(kind), subject).Scan(&t.CID, &t.Ref, &t.CreatedAt))
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading takedown: %w", err)
	}
	return t, nil
}
