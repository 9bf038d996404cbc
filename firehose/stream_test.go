package firehose_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/priority"
)

// TestIndigoConsumerConcurrentWriters runs indigo's own consumer against
// live subscriptions while several accounts write at once: every event
// arrives once, in order, and every #commit verifies.
func TestIndigoConsumerConcurrentWriters(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const repos, perRepo = 4, 15
	dids := make([]syntax.DID, repos)
	for i := range dids {
		dids[i] = b.newRepo(t)
	}
	b.waitSequenced(t, repos)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumers := []*indigoConsumer{newIndigoConsumer(), newIndigoConsumer()}
	var cwg sync.WaitGroup
	for _, c := range consumers {
		cwg.Go(func() { _ = c.consume(ctx, b) })
	}
	require.Eventually(t, func() bool { return b.hub.Live() == len(consumers) }, 10*time.Second, time.Millisecond)
	start := b.waitSequenced(t, repos)

	writeConcurrently(t, b, dids, perRepo)
	want := int64(repos + repos*perRepo + 1 + 4)
	last := b.waitSequenced(t, want)
	for _, c := range consumers {
		c.waitFor(t, last)
	}
	cancel()
	cwg.Wait()

	var wantSeqs []int64
	for _, ev := range b.allEvents(t) {
		if ev.Seq > start {
			wantSeqs = append(wantSeqs, ev.Seq)
		}
	}
	for _, c := range consumers {
		c.check(t, start, wantSeqs, repos*perRepo)
	}
}

// writeConcurrently has each of dids write perRepo posts at once while
// another account goes through its lifecycle (#identity, #account events).
func writeConcurrently(t *testing.T, b *bundle, dids []syntax.DID, perRepo int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, did := range dids {
		wg.Go(func() {
			for i := range perRepo {
				if _, err := b.tryWrite(did, fmt.Sprint("post ", i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// Account lifecycle events from another writer, interleaved.
	extra := b.newRepo(t)
	b.appendEvent(t, mustEncode(eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{
		Did: extra.String(), Handle: ptr("new.test"), Time: syntax.DatetimeNow().String()})))
	b.appendEvent(t, mustEncode(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{
		Did: extra.String(), Active: false, Status: ptr("deactivated"), Time: syntax.DatetimeNow().String()})))
	b.appendEvent(t, mustEncode(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{
		Did: extra.String(), Active: true, Time: syntax.DatetimeNow().String()})))
	b.appendEvent(t, mustEncode(eventlog.EncodeAccount(&comatproto.SyncSubscribeRepos_Account{
		Did: extra.String(), Active: false, Status: ptr("deleted"), Time: syntax.DatetimeNow().String()})))
	wg.Wait()
}

// indigoConsumer is a live subscription read by indigo's consumer: the seqs
// and kinds it received and the errors it met (a commit that did not
// verify, an error frame).
type indigoConsumer struct {
	mu     sync.Mutex
	seqs   []int64
	errs   []error
	counts map[string]int
	// last is the highest seq received; grew is closed and replaced each
	// time it grows.
	last int64
	grew chan struct{}
}

func newIndigoConsumer() *indigoConsumer {
	return &indigoConsumer{counts: map[string]int{}, grew: make(chan struct{})}
}

func (c *indigoConsumer) add(seq int64, kind string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seqs = append(c.seqs, seq)
	c.counts[kind]++
	if err != nil {
		c.errs = append(c.errs, err)
	}
	if seq > c.last {
		c.last = seq
		close(c.grew)
		c.grew = make(chan struct{})
	}
}

// consume subscribes live to b's firehose and reads it with indigo's
// stream handling until ctx ends.
func (c *indigoConsumer) consume(ctx context.Context, b *bundle) error {
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, b.wsURL, nil)
	if err != nil {
		return err
	}
	cb := &events.RepoStreamCallbacks{
		RepoCommit: func(e *comatproto.SyncSubscribeRepos_Commit) error {
			_, err := verifyCommitErr(ctx, b, e)
			c.add(e.Seq, "commit", err)
			return nil
		},
		RepoSync:     func(e *comatproto.SyncSubscribeRepos_Sync) error { c.add(e.Seq, "sync", nil); return nil },
		RepoIdentity: func(e *comatproto.SyncSubscribeRepos_Identity) error { c.add(e.Seq, "identity", nil); return nil },
		RepoAccount:  func(e *comatproto.SyncSubscribeRepos_Account) error { c.add(e.Seq, "account", nil); return nil },
		Error: func(e *events.ErrorFrame) error {
			c.add(0, "error", fmt.Errorf("error frame %s: %s", e.Error, e.Message))
			return nil
		},
	}
	sched := sequential.NewScheduler("test", cb.EventHandler)
	return events.HandleRepoStream(ctx, conn, sched, quietLogger)
}

// waitFor waits until the consumer has received seq last.
func (c *indigoConsumer) waitFor(t *testing.T, last int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		c.mu.Lock()
		got, grew := c.last, c.grew
		c.mu.Unlock()
		if got >= last {
			return
		}
		select {
		case <-grew:
		case <-deadline:
			t.Fatalf("the consumer got to seq %d, not %d", got, last)
		}
	}
}

// check compares what the consumer received with the log: no errors, seqs
// strictly increasing, every event after start once, and the kinds.
func (c *indigoConsumer) check(t *testing.T, start int64, wantSeqs []int64, commits int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Empty(t, c.errs)
	// A live subscription may also see events sequenced just before it
	// (not yet fanned out then); from start on it must see all of them.
	var got []int64
	for i, s := range c.seqs {
		require.True(t, i == 0 || s > c.seqs[i-1], "seqs strictly increase")
		if s > start {
			got = append(got, s)
		}
	}
	require.Equal(t, wantSeqs, got, "every event once, in order")
	require.Equal(t, commits, c.counts["commit"])
	require.Equal(t, 1, c.counts["identity"])
	require.Equal(t, 3, c.counts["account"])
	require.GreaterOrEqual(t, c.counts["sync"], 1)
}

func mustEncode(ev *eventlog.Encoded, err error) *eventlog.Encoded {
	if err != nil {
		panic(err)
	}
	return ev
}

func verifyCommitErr(ctx context.Context, b *bundle, c *comatproto.SyncSubscribeRepos_Commit) (bool, error) {
	if _, err := atrepo.VerifyCommitMessage(ctx, c); err != nil {
		return false, err
	}
	commit, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(c.Blocks))
	if err != nil {
		return false, err
	}
	key, err := b.keys.SigningKey(ctx, syntax.DID(c.Repo))
	if err != nil {
		return false, err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return false, err
	}
	return true, commit.VerifySignature(pub)
}

// TestCursorCases covers each way a subscription can start.
func TestCursorCases(t *testing.T) {
	t.Parallel()
	b := setup(t, options{hub: firehose.Config{Retention: time.Hour}})
	did := b.newRepo(t)
	for i := range 6 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	last := b.waitSequenced(t, 7)
	all := b.allEvents(t)
	require.Len(t, all, 7)
	// The first three events are older than the window.
	_, err := b.pool.Exec(context.Background(),
		"UPDATE events SET created_at = now() - interval '2 hours' WHERE seq <= $1", all[2].Seq)
	require.NoError(t, err)

	t.Run("none", func(t *testing.T) {
		conn := dial(t, b.wsURL, nil)
		require.Eventually(t, func() bool { return b.hub.Live() == 1 }, 10*time.Second, time.Millisecond)
		b.write(t, did, "live")
		f := nextAfter(t, conn, last)
		require.Equal(t, "#commit", f.kind)
		b.verifyCommit(t, f.commit)
	})

	// The log as it now stands, for the replay cases.
	all = b.allEvents(t)
	last = all[len(all)-1].Seq

	t.Run("zero", func(t *testing.T) {
		conn := dial(t, b.wsURL, ptr(int64(0)))
		got := readUntil(t, conn, last)
		// The whole window, no #info.
		requireSeqs(t, all[3:], got)
		for _, f := range got {
			require.Nil(t, f.info)
		}
	})
	t.Run("inside", func(t *testing.T) {
		conn := dial(t, b.wsURL, ptr(all[4].Seq))
		got := readUntil(t, conn, last)
		requireSeqs(t, all[5:], got)
		for _, f := range got {
			if f.commit != nil {
				b.verifyCommit(t, f.commit)
			}
		}
	})
	t.Run("at last", func(t *testing.T) {
		conn := dial(t, b.wsURL, ptr(last))
		require.Eventually(t, func() bool { return b.hub.Live() == 1 }, 10*time.Second, time.Millisecond)
		b.write(t, did, "after last")
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		require.Equal(t, last+1, f.seq)
	})
	all = b.allEvents(t)
	last = all[len(all)-1].Seq
	t.Run("outdated", func(t *testing.T) {
		conn := dial(t, b.wsURL, ptr(all[0].Seq))
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		require.Equal(t, "#info", f.kind)
		require.Equal(t, firehose.InfoOutdatedCursor, f.info.Name)
		got := readUntil(t, conn, last)
		requireSeqs(t, all[3:], got)
	})
	t.Run("future", func(t *testing.T) {
		conn := dial(t, b.wsURL, ptr(last+1000))
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		require.Equal(t, int64(-1), f.op)
		require.Equal(t, firehose.ErrNameFutureCursor, f.err.Error)
		_, err = readFrame(t, conn)
		require.Error(t, err, "the stream closes after the error frame")
	})
}

// TestHandoverDuringBurst subscribes with cursors while writers are busy:
// the switch from backfill to live must lose nothing and repeat nothing.
func TestHandoverDuringBurst(t *testing.T) {
	t.Parallel()
	// Tiny pages make the backfill long relative to the writes.
	b := setup(t, options{hub: firehose.Config{PageEvents: 3}})
	const repos, perRepo = 3, 25
	dids := make([]syntax.DID, repos)
	for i := range dids {
		dids[i] = b.newRepo(t)
	}
	for _, did := range dids {
		for i := range 5 {
			b.write(t, did, fmt.Sprint("before ", i))
		}
	}
	b.waitSequenced(t, repos*6)

	// Each subscription starts after a few more of the burst's commits:
	// written receives one value per commit.
	written := make(chan struct{}, repos*perRepo)
	var wg sync.WaitGroup
	for _, did := range dids {
		wg.Go(func() {
			for i := range perRepo {
				if _, err := b.tryWrite(did, fmt.Sprint("during ", i)); err != nil {
					t.Error(err)
					return
				}
				written <- struct{}{}
			}
		})
	}
	var conns []*websocket.Conn
	cursors := []int64{0, 1, 7}
	for _, c := range cursors {
		conns = append(conns, dial(t, b.wsURL, ptr(c)))
		for range 5 {
			<-written
		}
	}
	wg.Wait()
	want := int64(repos * (6 + perRepo))
	last := b.waitSequenced(t, want)
	all := b.allEvents(t)
	for i, conn := range conns {
		got := readUntil(t, conn, last)
		var exp []eventlog.Event
		for _, ev := range all {
			if ev.Seq > cursors[i] {
				exp = append(exp, ev)
			}
		}
		requireSeqs(t, exp, got)
		for _, f := range got {
			if f.commit != nil {
				b.verifyCommit(t, f.commit)
			}
		}
	}
}

// TestCrossProcess: a commit sequenced by one process reaches a subscriber
// connected to another process on the same database, through NOTIFY alone.
func TestCrossProcess(t *testing.T) {
	t.Parallel()
	a := setup(t, options{})
	// Process B runs no sequencer and polls only hourly: only a NOTIFY from
	// A's sequencer can wake it.
	bp := setup(t, options{dbURL: a.url, keys: a.keys, noSequencer: true,
		hub: firehose.Config{PollInterval: time.Hour}})
	did := a.newRepo(t)
	first := a.waitSequenced(t, 1)
	conn := dial(t, bp.wsURL, ptr(int64(0)))
	got := readUntil(t, conn, first)
	require.Len(t, got, 1)
	for i := range 5 {
		a.write(t, did, fmt.Sprint("cross ", i))
	}
	last := a.waitSequenced(t, 6)
	got = readUntil(t, conn, last)
	require.Len(t, got, 5)
	for i, f := range got {
		require.Equal(t, first+int64(i)+1, f.seq)
		a.verifyCommit(t, f.commit)
	}
}

// TestDisconnectStopsWork: a client that goes away mid-backfill stops the
// reads within a page.
func TestDisconnectStopsWork(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noSequencer: true, hub: firehose.Config{PageEvents: 2, PollInterval: time.Hour}})
	did := b.newRepo(t)
	for i := range 40 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	b.sequenceAll(t)
	conn := dial(t, b.wsURL, ptr(int64(0)))
	_, err := readFrame(t, conn)
	require.NoError(t, err)
	conn.Close()
	require.Eventually(t, func() bool { return b.hub.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
	m := b.queries.mark()
	// The server is done with the subscription once its handler returns:
	// whatever it read after the subscriber left has been read by then.
	select {
	case <-b.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription was not ended")
	}
	// Of events, at most the page in flight when the subscriber left (seen
	// once under -race on a loaded machine) and nothing after it.
	pages := 0
	for _, q := range b.queries.subscriptionsSince(m) {
		if strings.Contains(q, "FROM events") {
			pages++
		}
	}
	require.LessOrEqual(t, pages, 1, "no reads after the subscriber left, beyond the page in flight")
}

// TestHubClose ends every subscription (server shutdown).
func TestHubClose(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	conn := dial(t, b.wsURL, nil)
	require.Eventually(t, func() bool { return b.hub.Subscribers() == 1 }, 10*time.Second, time.Millisecond)
	b.hub.Close()
	_, err := readFrame(t, conn)
	require.Error(t, err)
	require.True(t, websocket.IsCloseError(err, websocket.CloseGoingAway), "got %v", err)
	require.Eventually(t, func() bool { return b.hub.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
}

// TestLiveFrameSizes sends live frames of each WebSocket length encoding
// (7-bit, 16-bit and 64-bit) through the batched live path.
func TestLiveFrameSizes(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	did := b.newRepo(t)
	b.waitSequenced(t, 1)
	conn := dial(t, b.wsURL, nil)
	require.Eventually(t, func() bool { return b.hub.Live() == 1 }, 10*time.Second, time.Millisecond)
	for _, n := range []int{10, 30_000, 900_000} {
		b.write(t, did, strings.Repeat("z", n))
	}
	last := b.waitSequenced(t, 4)
	var commits int
	for _, f := range readUntil(t, conn, last) {
		// A live subscription may start just before the #sync of seq 1
		// reached the hub; only the commits matter here.
		if f.commit != nil {
			b.verifyCommit(t, f.commit)
			commits++
		}
	}
	require.Equal(t, 3, commits)
}

// nextAfter returns the first frame with seq > after. A live subscription
// may begin with events sequenced just before it, not yet fanned out.
func nextAfter(t *testing.T, conn *websocket.Conn, after int64) *frame {
	t.Helper()
	for {
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		if f.seq > after {
			return f
		}
	}
}

// TestBackfillDrawsFromBudget: backfill pages are held against the shared
// in-flight budget and given back.
func TestBackfillDrawsFromBudget(t *testing.T) {
	t.Parallel()
	bud := budget.New(budget.Config{Capacity: 1 << 20})
	b := setup(t, options{hub: firehose.Config{Budget: bud, PageEvents: 4}})
	did := b.newRepo(t)
	for i := range 10 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	last := b.waitSequenced(t, 11)
	// Until the hub has delivered the last event, a subscription may join
	// the live fan-out after its first page and get the rest from there;
	// once it has, every event comes through a page.
	require.Eventually(t, func() bool { return b.hub.Delivered() >= last }, 10*time.Second, time.Millisecond)
	conn := dial(t, b.wsURL, ptr(int64(0)))
	require.Len(t, readUntil(t, conn, last), 11)
	require.Eventually(t, func() bool { return bud.Stats().InUse == 0 }, 10*time.Second, time.Millisecond)
	require.GreaterOrEqual(t, bud.Stats().Admitted, uint64(3), "one reservation per page")
}

// TestHealthSeesStuckConsumer: a consumer that reconnects at the same
// cursor, reads a frame and drops, again and again, is reported stuck at
// the event after its cursor; refusals and end reasons are recorded.
func TestHealthSeesStuckConsumer(t *testing.T) {
	t.Parallel()
	health := firehose.NewHealth(firehose.HealthConfig{Logger: quietLogger})
	b := setup(t, options{hub: firehose.Config{Health: health}})
	did := b.newRepo(t)
	for i := range 3 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	last := b.waitSequenced(t, 4)
	h := http.Header{"X-Forwarded-For": {"203.0.113.9"}, "User-Agent": {"stuck-relay/1.0"}}
	for range 3 {
		conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("%s?cursor=%d", b.wsURL, last-2), h)
		require.NoError(t, err)
		resp.Body.Close()
		_, err = readFrame(t, conn)
		require.NoError(t, err)
		conn.Close()
		require.Eventually(t, func() bool { return b.hub.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
	}
	b.hub.Refused("203.0.113.9")
	require.Eventually(t, func() bool { return health.StuckCount() == 1 }, 10*time.Second, time.Millisecond)
	var report *firehose.ConsumerReport
	for _, c := range health.Consumers() {
		if c.IP == "203.0.113.9" {
			report = &c
		}
	}
	require.NotNil(t, report)
	require.Equal(t, "stuck-relay/1.0", report.UserAgent)
	require.EqualValues(t, 3, report.Connections)
	require.EqualValues(t, 1, report.Refused)
	require.NotNil(t, report.Stuck)
	require.Equal(t, last-2, report.Stuck.Cursor)
	require.Equal(t, last-1, report.Stuck.Seq)
	for _, r := range report.Recent {
		require.Equal(t, firehose.EndClientClosed, r.Reason)
		require.GreaterOrEqual(t, r.Frames, int64(1))
	}

	// A future cursor ends with its own reason.
	conn := dial(t, b.wsURL, ptr(last+100))
	_, err := readFrame(t, conn)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, c := range health.Consumers() {
			for _, r := range c.Recent {
				if r.Reason == firehose.EndFutureCursor {
					return true
				}
			}
		}
		return false
	}, 10*time.Second, time.Millisecond)
}

// TestBackfillYieldsToWrites: with the server's writes-first gate, a
// backfilling subscriber reads no page while a write is in flight (here
// held for the whole wait, with a pause bound of an hour), and catches up
// once the write is done.
func TestBackfillYieldsToWrites(t *testing.T) {
	t.Parallel()
	gate := priority.New(priority.Config{MaxPause: time.Hour})
	b := setup(t, options{noSequencer: true, hub: firehose.Config{PageEvents: 2, PollInterval: time.Hour, Priority: gate}})
	did := b.newRepo(t)
	for i := range 6 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	last := b.sequenceAll(t)
	leave := gate.Enter()
	m := b.queries.mark()
	conn := dial(t, b.wsURL, ptr(int64(0)))
	require.Eventually(t, func() bool { return gate.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond,
		"the subscriber waits at the gate")
	for _, q := range b.queries.since(m) {
		// Resolving the cursor reads seqs only; a page reads bodies.
		require.NotContains(t, q, "body", "no page read while the write is in flight")
	}
	leave()
	got := readUntil(t, conn, last)
	require.Equal(t, last, got[len(got)-1].seq)
}
