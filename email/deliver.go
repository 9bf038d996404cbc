package email

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	gomail "github.com/wneessen/go-mail"

	"github.com/bulwark-pds/bulwark/db"
)

// maxNote bounds the error text kept on a row.
const maxNote = 1000

// outRow is a claimed outbox row.
type outRow struct {
	id        int64
	kind      Kind
	did       string
	recipient string
	purpose   Purpose
	code      *string
	expires   *time.Time
	data      messageData
	attempts  int
}

// Deliver sends the mail that is due now, one connection per batch, and
// returns how many went out. Mail whose code has expired is cancelled
// first. Without SMTP it sends nothing. A failed attempt is retried after
// RetryBase, doubling up to RetryMax, until MaxAttempts; a permanent
// refusal (5xx) fails the mail at once. Run calls it; tests and an
// operator's "flush" may too.
func (m *Mailer) Deliver(ctx context.Context) (int, error) {
	if _, err := m.pool.Exec(ctx, qExpireMessages, m.now()); err != nil {
		return 0, fmt.Errorf("email: expire: %w", db.Translate(err))
	}
	if m.client == nil {
		return 0, nil
	}
	sent := 0
	for ctx.Err() == nil {
		batch, err := m.claim(ctx)
		if err != nil {
			return sent, err
		}
		sent += m.sendBatch(ctx, batch)
		if len(batch) < m.cfg.BatchSize {
			break
		}
	}
	return sent, nil
}

// claim leases up to BatchSize due rows to this node.
func (m *Mailer) claim(ctx context.Context) ([]outRow, error) {
	now := m.now()
	rows, err := m.pool.Query(ctx, qClaimMessages, now, m.cfg.BatchSize, now.Add(m.cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("email: claim: %w", db.Translate(err))
	}
	defer rows.Close()
	var out []outRow
	for rows.Next() {
		var r outRow
		var kind, purpose string
		var data []byte
		if err := rows.Scan(&r.id, &kind, &r.did, &r.recipient, &purpose, &r.code, &r.expires, &data, &r.attempts); err != nil {
			return nil, fmt.Errorf("email: claim: %w", db.Translate(err))
		}
		r.kind, r.purpose = Kind(kind), Purpose(purpose)
		if err := json.Unmarshal(data, &r.data); err != nil {
			return nil, fmt.Errorf("email: claim: row %d data: %w", r.id, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("email: claim: %w", db.Translate(err))
	}
	return out, nil
}

// sendBatch sends batch over one connection and records each outcome.
func (m *Mailer) sendBatch(ctx context.Context, batch []outRow) int {
	if len(batch) == 0 {
		return 0
	}
	msgs := make([]*gomail.Msg, len(batch))
	live := 0
	for i := range batch {
		msg, err := m.build(&batch[i])
		if err != nil {
			m.fail(ctx, &batch[i], err)
			continue
		}
		msgs[i] = msg
		live++
	}
	if live == 0 {
		return 0
	}
	dctx, dcancel := context.WithTimeout(ctx, m.cfg.SendTimeout)
	client, err := m.client.DialToSMTPClientWithContext(dctx)
	dcancel()
	if err != nil {
		for i := range batch {
			switch {
			case msgs[i] == nil:
			case ctx.Err() != nil:
				m.release(ctx, &batch[i])
			default:
				m.retry(ctx, &batch[i], fmt.Errorf("connecting to the SMTP server: %w", err))
			}
		}
		return 0
	}
	defer func() { _ = m.client.CloseWithSMTPClient(client) }()
	sent := 0
	for i := range batch {
		if msgs[i] == nil {
			continue
		}
		r := &batch[i]
		if ctx.Err() != nil {
			m.release(ctx, r)
			continue
		}
		err := m.client.SendWithSMTPClient(client, msgs[i])
		switch {
		case err == nil:
			m.markSent(ctx, r)
			sent++
		case permanent(err):
			m.fail(ctx, r, err)
		default:
			m.retry(ctx, r, err)
		}
	}
	return sent
}

// permanent reports whether the server refused a mail for good (a 5xx
// reply to MAIL, RCPT or DATA): trying again cannot help.
func permanent(err error) bool {
	var se *gomail.SendError
	return errors.As(err, &se) && !se.IsTemp() && se.ErrorCode() >= 500
}

// build renders r into a go-mail message.
func (m *Mailer) build(r *outRow) (*gomail.Msg, error) {
	d := TemplateData{Handle: r.data.Handle, Hostname: m.cfg.Hostname, Subject: r.data.Subject, Content: r.data.Content}
	if r.kind.Purpose() != "" {
		if r.code == nil || r.expires == nil {
			return nil, errors.New("token mail without a code")
		}
		d.Token, d.ExpiresAt = *r.code, *r.expires
		d.ExpiresIn = expiresIn(r.expires.Sub(m.now()))
	}
	out, err := m.tpl.render(r.kind, d)
	if err != nil {
		return nil, err
	}
	msg := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	if err := msg.From(m.from); err != nil {
		return nil, fmt.Errorf("sender: %w", err)
	}
	if err := msg.To(r.recipient); err != nil {
		return nil, fmt.Errorf("recipient: %w", err)
	}
	msg.Subject(out.Subject)
	msg.SetDateWithValue(m.now())
	msg.SetMessageIDWithValue(fmt.Sprintf("%s.%d@%s", randomHex(8), r.id, m.msgHost))
	msg.SetBodyString(gomail.TypeTextPlain, out.Text)
	msg.AddAlternativeString(gomail.TypeTextHTML, out.HTML)
	return msg, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// logAttrs identify a row in logs: never its recipient or code.
func (r *outRow) logAttrs() []any {
	return []any{"id", r.id, "kind", string(r.kind), "did", r.did, "attempt", r.attempts}
}

// recordTimeout bounds the statement that records an outcome.
const recordTimeout = 10 * time.Second

// record is the context an outcome is recorded under: it outlives ctx, so
// that a Stop mid-batch still records what was sent (a mail sent but not
// marked would go out again after its lease).
func record(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
}

func (m *Mailer) markSent(ctx context.Context, r *outRow) {
	m.metrics.sent.WithLabelValues(string(r.kind)).Inc()
	ctx, cancel := record(ctx)
	defer cancel()
	if _, err := m.pool.Exec(ctx, qMarkSent, r.id, m.now()); err != nil {
		m.log.Error("recording a sent mail (it may be sent again)", append(r.logAttrs(), "err", db.Translate(err))...)
		return
	}
	m.log.Info("mail sent", r.logAttrs()...)
}

// release hands r back untried.
func (m *Mailer) release(ctx context.Context, r *outRow) {
	ctx, cancel := record(ctx)
	defer cancel()
	if _, err := m.pool.Exec(ctx, qReleaseMessage, r.id, m.now()); err != nil {
		m.log.Warn("handing back an unsent mail (it waits for its lease)", append(r.logAttrs(), "err", db.Translate(err))...)
	}
}

// retry schedules r's next attempt, or fails it after the last.
func (m *Mailer) retry(ctx context.Context, r *outRow, cause error) {
	if r.attempts >= m.cfg.MaxAttempts {
		m.fail(ctx, r, fmt.Errorf("after %d attempts: %w", r.attempts, cause))
		return
	}
	wait := m.backoff(r.attempts)
	ctx, cancel := record(ctx)
	defer cancel()
	tag, err := m.pool.Exec(ctx, qMarkRetry, r.id, m.now().Add(wait), note(cause), m.now())
	switch {
	case err != nil:
		m.log.Error("recording a failed attempt", append(r.logAttrs(), "err", db.Translate(err))...)
	case tag.RowsAffected() == 0:
		m.log.Debug("mail not sent and cancelled meanwhile", append(r.logAttrs(), "err", cause)...)
		return
	}
	m.metrics.retries.WithLabelValues(string(r.kind)).Inc()
	m.log.Warn("mail not sent; will retry", append(r.logAttrs(), "retry_in", wait, "err", cause)...)
}

// backoff is the wait after the n-th failed attempt: RetryBase doubled
// n-1 times, at most RetryMax.
func (m *Mailer) backoff(n int) time.Duration {
	wait := m.cfg.RetryBase
	for i := 1; i < n && wait < m.cfg.RetryMax; i++ {
		wait *= 2
	}
	return min(wait, m.cfg.RetryMax)
}

func (m *Mailer) fail(ctx context.Context, r *outRow, cause error) {
	ctx, cancel := record(ctx)
	defer cancel()
	tag, err := m.pool.Exec(ctx, qMarkFailed, r.id, note(cause), m.now())
	switch {
	case err != nil:
		m.log.Error("recording a failed mail", append(r.logAttrs(), "err", db.Translate(err))...)
	case tag.RowsAffected() == 0:
		m.log.Debug("mail not sent and cancelled meanwhile", append(r.logAttrs(), "err", cause)...)
		return
	}
	m.metrics.failed.WithLabelValues(string(r.kind)).Inc()
	m.log.Error("mail failed; giving up (kept in the outbox)", append(r.logAttrs(), "err", cause)...)
}

func note(err error) string {
	s := err.Error()
	if len(s) > maxNote {
		s = truncateUTF8(s, maxNote)
	}
	return s
}

// Prune deletes sent and cancelled mail older than Retention, failed mail
// older than FailedRetention, and codes expired for a day. Run calls it
// every ten minutes.
func (m *Mailer) Prune(ctx context.Context) (int64, error) {
	const batch = 1000
	now := m.now()
	var total int64
	for _, p := range []struct {
		state  string
		cutoff time.Time
	}{
		{StateSent, now.Add(-m.cfg.Retention)},
		{StateCancelled, now.Add(-m.cfg.Retention)},
		{StateFailed, now.Add(-m.cfg.FailedRetention)},
	} {
		for {
			tag, err := m.pool.Exec(ctx, qPruneMessages, p.state, p.cutoff, batch)
			if err != nil {
				return total, fmt.Errorf("email: prune %s: %w", p.state, db.Translate(err))
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < batch {
				break
			}
		}
	}
	n, err := m.PruneTokens(ctx, m.pool)
	if n+total > 0 {
		m.log.Log(ctx, slog.LevelDebug, "pruned the outbox", "rows", total, "tokens", n)
	}
	return total + n, err
}
