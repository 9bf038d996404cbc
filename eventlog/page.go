package eventlog

import (
	"context"
	"fmt"

	"github.com/bulwark-pds/bulwark/db"
)

// Pager reads the log a bounded page at a time into memory it keeps from
// one page to the next: a backfill that pages through the whole log
// allocates almost nothing per event (the bodies are slices of one buffer,
// reused; each row is scanned into the same fields), so a long replay
// leaves next to no garbage behind it and the process's memory stays where
// it was, whatever the collector's settings. A Pager is for one reader at
// a time.
type Pager struct {
	log    *Log
	events []Event
	buf    []byte
	ends   []int
	// The row being scanned, and Scan's destinations pointing into it.
	row  Event
	kind kindScanner
	body arena
	dest []any
}

// NewPager returns a pager over l.
func (l *Log) NewPager() *Pager {
	p := &Pager{log: l}
	p.body.buf = &p.buf
	p.dest = []any{&p.row.Seq, &p.row.DID, &p.kind, &p.row.Rev, &p.row.CreatedAt, &p.body,
		&p.row.SeqOffset, &p.row.BlocksLen, &p.row.OpsCount}
	return p
}

// Page is Log.Page into the pager's memory: the events (and their bodies)
// are valid until the next call or Release.
func (p *Pager) Page(ctx context.Context, after int64, limit, maxBytes int) ([]Event, error) {
	rows, err := p.log.pool.Query(ctx, qEventsAfterBounded, after, limit, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("reading events after %d: %w", after, db.Translate(err))
	}
	defer rows.Close()
	p.events, p.buf, p.ends = p.events[:0], p.buf[:0], p.ends[:0]
	for rows.Next() {
		if err := rows.Scan(p.dest...); err != nil {
			return nil, fmt.Errorf("reading events after %d: %w", after, db.Translate(err))
		}
		p.row.Kind = p.kind.kind
		p.events = append(p.events, p.row)
		// Where each body ends: appending may move buf, so the bodies
		// are sliced once the page is read.
		p.ends = append(p.ends, len(p.buf))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading events after %d: %w", after, db.Translate(err))
	}
	start := 0
	for i, end := range p.ends {
		p.events[i].Body = p.buf[start:end:end]
		start = end
	}
	return p.events, nil
}

// Release drops the pager's buffer if it grew past keep bytes (one large
// event should not stay with a reader), or all its memory with keep < 0.
func (p *Pager) Release(keep int) {
	clear(p.events[:cap(p.events)])
	if keep < 0 || cap(p.buf) > keep {
		p.buf = nil
	}
	if keep < 0 {
		p.events, p.ends = nil, nil
	}
}

// arena scans a bytea by appending it to *buf (pgtype.BytesScanner).
type arena struct{ buf *[]byte }

func (a *arena) ScanBytes(v []byte) error {
	*a.buf = append(*a.buf, v...)
	return nil
}

// kindScanner scans an event kind into its constant, allocating no string
// for the four kinds there are.
type kindScanner struct{ kind Kind }

func (k *kindScanner) ScanBytes(v []byte) error {
	for _, c := range []Kind{KindCommit, KindSync, KindIdentity, KindAccount} {
		if string(v) == string(c) {
			k.kind = c
			return nil
		}
	}
	k.kind = Kind(v)
	return nil
}
