package firehose_test

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/metrics"
)

// firehoseFigures reads the firehose series a test looks at.
type firehoseFigures struct {
	subscribers, commits, syncs, errors, bytes float64
	clientClosed, futureCursor, rateLimited    float64
}

func readFigures() firehoseFigures {
	v := func(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
	return firehoseFigures{
		subscribers:  v(metrics.FirehoseSubscribers),
		commits:      v(metrics.FirehoseFrames.WithLabelValues("commit")),
		syncs:        v(metrics.FirehoseFrames.WithLabelValues("sync")),
		errors:       v(metrics.FirehoseFrames.WithLabelValues("error")),
		bytes:        v(metrics.FirehoseBytes),
		clientClosed: v(metrics.FirehoseDisconnects.WithLabelValues("client_closed")),
		futureCursor: v(metrics.FirehoseDisconnects.WithLabelValues("future_cursor")),
		rateLimited:  v(metrics.FirehoseRefused.WithLabelValues(firehose.RefusedRateLimited)),
	}
}

// TestMetricsMoveWithSubscriptions: real subscriptions (backfill, live, a
// future cursor, a refused upgrade, a client leaving) move the firehose
// series by exactly what they did. Not parallel: the series are the
// process's, and other tests' subscriptions would move them too.
func TestMetricsMoveWithSubscriptions(t *testing.T) {
	adm := firehose.NewAdmission(firehose.AdmissionConfig{Burst: 2, Rate: 1e-9})
	b := setup(t, options{admission: adm})
	did := b.newRepo(t)
	b.write(t, did, "one")
	last := b.waitSequenced(t, 2)
	start := readFigures()

	// Backfill from the start: the #sync of the new repo and a #commit.
	hdr := http.Header{"X-Forwarded-For": {"192.0.2.7"}}
	conn, _, err := websocket.DefaultDialer.Dial(b.wsURL+"?cursor=0", hdr)
	require.NoError(t, err)
	got := readUntil(t, conn, last)
	var wire float64
	for _, f := range got {
		wire += float64(len(f.raw))
	}
	// Live: one more commit, the same bytes every live subscriber gets.
	b.write(t, did, "two")
	live := readUntil(t, conn, b.waitSequenced(t, last+1))
	for _, f := range live {
		wire += float64(len(f.raw))
	}
	require.Eventually(t, func() bool { return readFigures().bytes-start.bytes == wire }, 10*time.Second, time.Millisecond,
		"bytes_sent_total counts the frames' bytes")
	now := readFigures()
	require.Equal(t, 1.0, now.subscribers-start.subscribers)
	require.Equal(t, 2.0, now.commits-start.commits)
	require.Equal(t, 1.0, now.syncs-start.syncs)

	// A cursor past the head: an error frame, and the stream ends.
	future, _, err := websocket.DefaultDialer.Dial(b.wsURL+"?cursor=999999", hdr)
	require.NoError(t, err)
	f, err := readFrame(t, future)
	require.NoError(t, err)
	require.NotNil(t, f.err)
	<-b.ended
	future.Close()

	// The client's bucket (burst 2) is spent: the next upgrade is refused.
	_, resp, err := websocket.DefaultDialer.Dial(b.wsURL, hdr)
	require.Error(t, err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

	// The first client leaves.
	conn.Close()
	<-b.ended
	end := readFigures()
	require.Equal(t, start.subscribers, end.subscribers, "both streams are over")
	require.Equal(t, 1.0, end.errors-start.errors)
	require.Equal(t, 1.0, end.futureCursor-start.futureCursor)
	require.Equal(t, 1.0, end.clientClosed-start.clientClosed)
	require.Equal(t, 1.0, end.rateLimited-start.rateLimited)
	require.Equal(t, wire+float64(len(f.raw)), end.bytes-start.bytes)
}

// The admission's refusals are counted by reason.
func TestAdmissionCountsRefusals(t *testing.T) {
	adm := firehose.NewAdmission(firehose.AdmissionConfig{Burst: 1, MaxPerClient: 1, MaxSubscribers: 2})
	perClient := metrics.FirehoseRefused.WithLabelValues(firehose.RefusedTooManyFromClient)
	full := metrics.FirehoseRefused.WithLabelValues(firehose.RefusedServerFull)
	p0, f0 := testutil.ToFloat64(perClient), testutil.ToFloat64(full)
	now := time.Now()
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	_, _, err := adm.Admit(a, now)
	require.NoError(t, err)
	_, _, err = adm.Admit(a, now)
	require.ErrorIs(t, err, firehose.ErrTooManyFromClient)
	_, _, err = adm.Admit(b, now)
	require.NoError(t, err)
	_, _, err = adm.Admit(netip.MustParseAddr("192.0.2.3"), now)
	require.ErrorIs(t, err, firehose.ErrServerFull)
	require.Equal(t, 1.0, testutil.ToFloat64(perClient)-p0)
	require.Equal(t, 1.0, testutil.ToFloat64(full)-f0)
}
