package pds

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Request bodies of long-running procedures (uploadBlob) are not under
// the server's ReadTimeout, which a large upload on a slow uplink would
// outlast. They are held to a minimum transfer rate instead: after a
// grace period, the body must have arrived at MinBodyRate on average
// since it began, and no read may wait longer than the grace period. A
// body of n bytes therefore gets at most BodyGrace + n/MinBodyRate,
// however it is sent; a client trickling a byte every few seconds is cut
// off once the grace period is over.
const (
	// MinBodyRate is the slowest average rate, in bytes a second, a
	// long-running request's body may arrive at: a poor mobile uplink
	// sends several times this.
	MinBodyRate = 8 << 10
	// BodyGrace is how long a body may take before the rate applies
	// (connection set-up, a slow start), and the longest one read may
	// wait for data.
	BodyGrace = 30 * time.Second
)

// errBodyTooSlow is what a body read fails with when the client fell
// behind the rate, or past the body's deadline.
var errBodyTooSlow = errors.New("request body arrived too slowly")

// bodyRate is the rule rateReader applies; tests shorten it.
type bodyRate struct {
	grace time.Duration
	rate  int64 // bytes a second
	// limit, when set, is the longest the whole body may take, however
	// fast it starts (importRepo: a slot is held until the body is in).
	limit time.Duration
}

var defaultBodyRate = bodyRate{grace: BodyGrace, rate: MinBodyRate}

// rateReader enforces bodyRate on a request body by moving the
// connection's read deadline before every read: to when the schedule
// says the next byte is due, or BodyGrace from now, whichever is sooner.
type rateReader struct {
	r     io.Reader
	rc    *http.ResponseController
	rule  bodyRate
	start time.Time
	n     int64
	// end is the error that ended the body (io.EOF when it all came).
	end error
}

// ended reports whether the body was read to its end or failed: nothing
// more of it is waiting on the connection to be read.
func (b *rateReader) ended() bool { return b.end != nil }

func newRateReader(w http.ResponseWriter, body io.Reader, rule bodyRate) *rateReader {
	return &rateReader{r: body, rc: http.NewResponseController(w), rule: rule, start: time.Now()}
}

func (b *rateReader) Read(p []byte) (int, error) {
	if b.end != nil {
		// Past the end no deadline is set: net/http's read for the next
		// request runs on the connection by then, and a deadline firing
		// would cancel this request's context while it is still handled.
		return b.r.Read(p)
	}
	now := time.Now()
	due := b.start.Add(b.rule.grace + time.Duration(float64(b.n+1)/float64(b.rule.rate)*float64(time.Second)))
	if idle := now.Add(b.rule.grace); idle.Before(due) {
		due = idle
	}
	end := b.start.Add(b.rule.limit)
	if b.rule.limit > 0 && end.Before(due) {
		due = end
	}
	_ = b.rc.SetReadDeadline(due)
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil {
		b.end = err
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		took := time.Since(b.start)
		if b.rule.limit > 0 && took >= b.rule.limit {
			err = fmt.Errorf("%w: %d bytes in %s, and the whole body must arrive within %s: %w",
				errBodyTooSlow, b.n, took.Round(time.Millisecond), b.rule.limit, err)
		} else {
			err = fmt.Errorf("%w: %d bytes in %s, below %d bytes a second: %w",
				errBodyTooSlow, b.n, took.Round(time.Millisecond), b.rule.rate, err)
		}
	}
	return n, err
}
