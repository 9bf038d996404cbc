package email

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/mail"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qUpsertToken         = queries.MustGet("UpsertToken")
	qLockToken           = queries.MustGet("LockToken")
	qLockTokenByCode     = queries.MustGet("LockTokenByCode")
	qDeleteToken         = queries.MustGet("DeleteToken")
	qDeleteExpiredTokens = queries.MustGet("DeleteExpiredTokens")
	qDeleteAcctTokens    = queries.MustGet("DeleteAccountTokens")
	qCancelAcctTokenMail = queries.MustGet("CancelAccountTokenMail")
	qCancelTokenMail     = queries.MustGet("CancelTokenMail")
	qPendingTokens       = queries.MustGet("PendingTokens")
	qTokenIssued         = queries.MustGet("TokenIssued")
	qCountTokenFailure   = queries.MustGet("CountTokenFailure")
	qInsertMessage       = queries.MustGet("InsertMessage")
	qExpireMessages      = queries.MustGet("ExpireMessages")
	qClaimMessages       = queries.MustGet("ClaimMessages")
	qMarkSent            = queries.MustGet("MarkSent")
	qMarkRetry           = queries.MustGet("MarkRetry")
	qMarkFailed          = queries.MustGet("MarkFailed")
	qReleaseMessage      = queries.MustGet("ReleaseMessage")
	qPruneMessages       = queries.MustGet("PruneMessages")
	qCountByState        = queries.MustGet("CountByState")
	qListenEmail         = queries.MustGet("ListenEmail")
)

// NotifyChannel is the Postgres channel on which Enqueue wakes the
// workers of every node.
const NotifyChannel = "bulwark_email"

// Outbox states (the email_outbox.state column).
const (
	StateHeld      = "held"
	StatePending   = "pending"
	StateSent      = "sent"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// States lists every outbox state.
var States = []string{StateHeld, StatePending, StateSent, StateFailed, StateCancelled}

// Limits on what a message may carry. The recipient's is RFC 5321's path
// limit; the others keep a row, and a mail, of reasonable size whatever an
// administrator pastes.
const (
	MaxRecipientLen    = 254
	MaxHandleLen       = 253
	MaxAdminSubjectLen = 500
	MaxAdminContentLen = 64 << 10
)

// Message is one mail to queue.
type Message struct {
	// Kind selects the templates.
	Kind Kind
	// To is the recipient's address.
	To string
	// DID is the account the mail is about ("" for none). Its outbox rows
	// go when the account does.
	DID syntax.DID
	// Handle is the account's handle, for the greeting.
	Handle string
	// Code and ExpiresAt are the code a token kind carries and its expiry.
	Code      string
	ExpiresAt time.Time
	// Subject and Content are an admin message's.
	Subject string
	Content string
}

// messageData is the data column.
type messageData struct {
	Handle  string `json:"handle,omitempty"`
	Subject string `json:"subject,omitempty"`
	Content string `json:"content,omitempty"`
}

// check validates msg and returns the bare recipient address.
func (msg *Message) check() (string, error) {
	to, err := msg.checkEnvelope()
	if err != nil {
		return "", err
	}
	if msg.Kind.Purpose() != "" {
		if msg.Code == "" || msg.ExpiresAt.IsZero() {
			return "", fmt.Errorf("%w: %s mail without a code or expiry", ErrInvalidMessage, msg.Kind)
		}
		return to, nil
	}
	if len(msg.Subject) > MaxAdminSubjectLen || !utf8.ValidString(msg.Subject) {
		return "", fmt.Errorf("%w: subject longer than %d bytes or not UTF-8", ErrInvalidMessage, MaxAdminSubjectLen)
	}
	if len(msg.Content) > MaxAdminContentLen || !utf8.ValidString(msg.Content) {
		return "", fmt.Errorf("%w: content longer than %d bytes or not UTF-8", ErrInvalidMessage, MaxAdminContentLen)
	}
	if strings.TrimSpace(msg.Content) == "" {
		return "", fmt.Errorf("%w: empty content", ErrInvalidMessage)
	}
	return to, nil
}

// checkEnvelope validates the kind, recipient and handle.
func (msg *Message) checkEnvelope() (string, error) {
	if !msg.Kind.Valid() {
		return "", fmt.Errorf("%w: unknown kind %q", ErrInvalidMessage, msg.Kind)
	}
	to, err := checkAddress(msg.To)
	if err != nil {
		return "", err
	}
	if len(msg.Handle) > MaxHandleLen || !utf8.ValidString(msg.Handle) {
		return "", fmt.Errorf("%w: handle longer than %d bytes or not UTF-8", ErrInvalidMessage, MaxHandleLen)
	}
	return to, nil
}

// checkAddress parses a recipient ("alice@example.com"; a display name is
// dropped).
func checkAddress(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("%w: no recipient", ErrInvalidMessage)
	}
	if len(raw) > MaxRecipientLen {
		return "", fmt.Errorf("%w: recipient longer than %d bytes", ErrInvalidMessage, MaxRecipientLen)
	}
	a, err := mail.ParseAddress(raw)
	if err != nil || !strings.Contains(a.Address, "@") {
		return "", fmt.Errorf("%w: malformed recipient address", ErrInvalidMessage)
	}
	return a.Address, nil
}

// Enqueue writes msg to the outbox through q, which should be the
// transaction of the request that causes the mail: the mail exists if and
// only if that commits, and its commit wakes the workers. It returns the
// row's id. Without SMTP the row is held; it is sent once a node with SMTP
// runs the worker.
func (m *Mailer) Enqueue(ctx context.Context, q db.DBTX, msg Message) (int64, error) {
	to, err := msg.check()
	if err != nil {
		return 0, err
	}
	if err := m.admit(msg.Kind, to); err != nil {
		return 0, err
	}
	return m.insert(ctx, q, msg, to)
}

func (m *Mailer) insert(ctx context.Context, q db.DBTX, msg Message, to string) (int64, error) {
	state := StatePending
	if m.client == nil {
		state = StateHeld
	}
	data, err := json.Marshal(messageData{Handle: msg.Handle, Subject: msg.Subject, Content: msg.Content})
	if err != nil {
		return 0, fmt.Errorf("email: enqueue: %w", err)
	}
	var did, purpose, code *string
	var expires *time.Time
	if msg.DID != "" {
		s := msg.DID.String()
		did = &s
	}
	if p := msg.Kind.Purpose(); p != "" {
		s := string(p)
		purpose, code, expires = &s, &msg.Code, &msg.ExpiresAt
	}
	var id int64
	var notified any
	err = q.QueryRow(ctx, qInsertMessage, state, string(msg.Kind), did, to, purpose, code, expires, data, m.now()).
		Scan(&id, &notified)
	if err != nil {
		return 0, fmt.Errorf("email: enqueue %s: %w", msg.Kind, db.Translate(err))
	}
	return id, nil
}

// TokenData is what a token mail says besides the code.
type TokenData struct {
	// Handle is the account's handle, for the greeting.
	Handle string
}

// SendToken issues a new code for did and purpose (replacing any earlier
// one) and queues the mail that carries it to the address to, all through
// q, which should be the request's transaction. An address over
// Config.RecipientLimit is *RecipientLimitError, and nothing is issued.
func (m *Mailer) SendToken(ctx context.Context, q db.DBTX, did syntax.DID, to string, purpose Purpose, data TokenData) error {
	if !purpose.Valid() {
		return fmt.Errorf("%w: %q", ErrInvalidPurpose, purpose)
	}
	msg := Message{Kind: Kind(purpose), To: to, DID: did, Handle: data.Handle}
	// Checked before the code is issued: bad input, or an address that
	// had its share of mail, changes nothing.
	addr, err := msg.checkEnvelope()
	if err != nil {
		return err
	}
	if err := m.admit(msg.Kind, addr); err != nil {
		return err
	}
	msg.Code, msg.ExpiresAt, err = m.issue(ctx, q, did, purpose)
	if err != nil {
		return err
	}
	_, err = m.insert(ctx, q, msg, addr)
	return err
}

// SendAdmin queues an administrator's message (com.atproto.admin.sendEmail)
// to the address to of account did. An empty subject gets the default
// subject template's.
func (m *Mailer) SendAdmin(ctx context.Context, q db.DBTX, did syntax.DID, to, subject, content string) error {
	_, err := m.Enqueue(ctx, q, Message{Kind: KindAdminMessage, To: to, DID: did, Subject: subject, Content: content})
	return err
}
