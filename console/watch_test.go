package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// statements records the SQL a pool runs.
type statements struct {
	mu  sync.Mutex
	all []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	s.all = append(s.all, strings.Join(strings.Fields(d.SQL), " "))
	s.mu.Unlock()
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// since returns the statements after the first n, and how many there are.
func (s *statements) since(n int) ([]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.all[n:]...), len(s.all)
}

// hostStatusRelay answers getHostStatus with the seq it is set to, and
// counts the calls.
type hostStatusRelay struct {
	*httptest.Server
	seq   atomic.Int64
	calls atomic.Int64
}

func newHostStatusRelay(t *testing.T, hostname string) *hostStatusRelay {
	r := &hostStatusRelay{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if req.URL.Path != "/xrpc/com.atproto.sync.getHostStatus" || req.URL.Query().Get("hostname") != hostname {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"HostNotFound","message":"host not found"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": hostname, "seq": r.seq.Load(), "status": "active", "accountCount": 1})
	}))
	t.Cleanup(r.Close)
	return r
}

// The relay watch costs one HTTP call per relay per check, each bounded
// by the timeout, and reads nothing from the database but the head seq
// (one row), except the event descriptions of a relay entering stuck.
func TestRelayWatchCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trace := &statements{}
	pcfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = trace
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	appendEvents := func(n int) int64 {
		for i := range n {
			enc, err := eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: fmt.Sprintf("did:plc:watchcost%016d", i), Time: syntax.DatetimeNow().String()})
			require.NoError(t, err)
			require.NoError(t, eventlog.Append(ctx, pool, enc))
		}
		_, err := seq.SequenceBatch(ctx)
		require.NoError(t, err)
		last, err := eventlog.NewLog(pool).LastSeq(ctx)
		require.NoError(t, err)
		return last
	}
	head := appendEvents(3)

	a, b := newHostStatusRelay(t, "pds.test"), newHostStatusRelay(t, "pds.test")
	a.seq.Store(head)
	b.seq.Store(head)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	stalled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(stalled.Close)
	h, ev := console.WatchSources(eventlog.NewLog(pool))
	watch, err := relaywatch.New(relaywatch.Config{
		Hostname: "pds.test", Relays: []string{a.URL, b.URL, stalled.URL}, Head: h, Events: ev,
		Timeout: 300 * time.Millisecond, StuckChecks: 2, StuckFor: time.Millisecond, Logger: quiet,
	})
	require.NoError(t, err)

	_, mark := trace.since(0)
	for i := range 5 {
		reps := watch.CheckNow(ctx)
		require.Equal(t, int64(i+1), a.calls.Load())
		require.Equal(t, int64(i+1), b.calls.Load())
		require.Equal(t, relaywatch.StateUnreachable, reps[0].State, "the stalled relay's call ended at the timeout")
		require.Contains(t, reps[0].Error, "no answer within 300ms")
	}
	sqls, mark := trace.since(mark)
	require.Equal(t, 5, len(sqls), "%q", sqls)
	for _, q := range sqls {
		require.Equal(t, "SELECT last_seq FROM sequencer_state WHERE id = 1", q)
	}

	// Relay a stops at the head while new events come: stuck on the second
	// check. Only the check that finds it stuck describes events.
	head = appendEvents(2)
	_, mark = trace.since(0)
	watch.CheckNow(ctx)
	first, mark := trace.since(mark)
	require.Len(t, first, 1)
	reps := watch.CheckNow(ctx)
	entering, mark := trace.since(mark)
	require.Equal(t, relaywatch.StateStuck, reps[0].State)
	require.Equal(t, head-1, reps[0].Event.Seq)
	require.Greater(t, len(entering), 1)
	require.LessOrEqual(t, len(entering), 1+8, "a bounded look at the events past the relay's seq: %q", entering)
	for range 3 {
		watch.CheckNow(ctx)
	}
	later, _ := trace.since(mark)
	require.Len(t, later, 3, "staying stuck reads only the head: %q", later)
}
