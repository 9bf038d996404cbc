package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog/eventlogtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// subscribe opens subscribeRepos at cursor on s.
func (s *liveServer) subscribe(t *testing.T, cursor int64) *websocket.Conn {
	t.Helper()
	ws := "ws" + strings.TrimPrefix(s.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos?cursor=" + strconv.FormatInt(cursor, 10)
	conn, resp, err := websocket.DefaultDialer.Dial(ws, http.Header{"User-Agent": {"restored-test-appview/1"}})
	require.NoError(t, err)
	resp.Body.Close()
	t.Cleanup(func() { conn.Close() })
	return conn
}

// firstFrame reads a frame: the seq of a #commit, or the error frame's
// name.
func firstFrame(t *testing.T, conn *websocket.Conn) (seq int64, errName string) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitLimit)))
	_, raw, err := conn.ReadMessage()
	require.NoError(t, err)
	if seq, ok := frameSeq(t, raw); ok {
		return seq, ""
	}
	r := bytes.NewReader(raw)
	var hdr events.EventHeader
	require.NoError(t, hdr.UnmarshalCBOR(r))
	var ef events.ErrorFrame
	require.NoError(t, ef.UnmarshalCBOR(r))
	return 0, ef.Error
}

// TestRestoredServerWarnsOfFutureCursor replays the incident: a consumer
// read the server past what a backup holds, the backup is restored, and
// the consumer comes back with its cursor. Restore says where the restored
// firehose ends and what to run; the server refuses the consumer with
// FutureCursor each time and says so once, with its cursor and the
// raise-seq command; after that command the consumer is served.
func TestRestoredServerWarnsOfFutureCursor(t *testing.T) {
	t.Parallel()
	_, plc := plctest.NewServer(t)
	src := startLiveServer(t, serverOptions{plcURL: plc.URL})
	users := populate(t, src)
	out := filepath.Join(t.TempDir(), "backup")
	code, _, errOut := cli("backup", "--data-dir", src.dataDir, "--database-url", src.databaseURL, "--hostname", src.hostname, "--out", out)
	require.Equal(t, 0, code, errOut)
	token, status := src.login(t, users[0].handle, users[0].password)
	require.Equal(t, http.StatusOK, status)
	for i := range 3 {
		src.createRecord(t, token, users[0].did, "com.example.note", map[string]any{"$type": "com.example.note", "text": fmt.Sprint("after the backup ", i)})
	}
	cursor := src.sequenced(t, users) // where the consumer had read up to
	src.stop(t)

	target, dst := dbtest.NewURL(t), t.TempDir()
	code, stdout, errOut := cli("restore", "--from", out, "--data-dir", dst, "--database-url", target, "--hostname", src.hostname, "--force")
	require.Equal(t, 0, code, errOut)
	m := regexp.MustCompile(`Next: the restored firehose ends at seq (\d+)\.`).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	restoredLast, _ := strconv.ParseInt(m[1], 10, 64)
	require.Less(t, restoredLast, cursor)
	s := startLiveServer(t, serverOptions{plcURL: plc.URL, dataDir: dst, databaseURL: target, hostname: src.hostname})

	for range 3 {
		conn := s.subscribe(t, cursor)
		_, name := firstFrame(t, conn)
		require.Equal(t, "FutureCursor", name)
		conn.Close()
	}
	warning := func() string {
		for line := range strings.Lines(s.logs.String()) {
			if strings.Contains(line, "cursor beyond our newest event") {
				return line
			}
		}
		return ""
	}
	require.Equal(t, 1, strings.Count(s.logs.String(), "cursor beyond our newest event"), "warned once: %s", s.logs)
	for _, want := range []string{"level=WARN", "user_agent=restored-test-appview/1", fmt.Sprintf("cursor=%d", cursor), fmt.Sprintf("head=%d", restoredLast),
		fmt.Sprintf("bulwark admin firehose raise-seq --floor %d ", cursor)} {
		require.Contains(t, warning(), want)
	}
	var consumers struct {
		Consumers []struct {
			UserAgent    string `json:"userAgent"`
			FutureCursor *struct {
				Cursor   int64  `json:"cursor"`
				Refusals int64  `json:"refusals"`
				Command  string `json:"command"`
			} `json:"futureCursor"`
		} `json:"consumers"`
	}
	s.adminJSON(t, &consumers, "firehose", "consumers")
	require.Len(t, consumers.Consumers, 1)
	require.Equal(t, cursor, consumers.Consumers[0].FutureCursor.Cursor)
	require.EqualValues(t, 3, consumers.Consumers[0].FutureCursor.Refusals)

	// The operator runs the command given.
	s.admin(t, "firehose", "raise-seq", "--floor", strconv.FormatInt(cursor, 10), "--reason", "restored backup")
	conn := s.subscribe(t, cursor)
	token, status = s.login(t, users[1].handle, users[1].password)
	require.Equal(t, http.StatusOK, status)
	s.createRecord(t, token, users[1].did, "com.example.note", map[string]any{"$type": "com.example.note", "text": "after the raise"})
	seq, name := firstFrame(t, conn)
	require.Empty(t, name, "served after raise-seq")
	require.Equal(t, cursor+1, seq, "the next event, live")
	require.Contains(t, s.logs.String(), "cursor is within our sequence again")
}

// alertReceiver collects the alerts POSTed to it.
type alertReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []alert.Alert
}

func newAlertReceiver(t *testing.T) *alertReceiver {
	r := &alertReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var a alert.Alert
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&a); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, a)
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *alertReceiver) alerts() []alert.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]alert.Alert(nil), r.got...)
}

// loopRelay reads subscribeRepos like indigo's relay: a frame over
// 5,000,000 bytes drops the connection and it redials at once at the same
// cursor.
func loopRelay(t *testing.T, wsURL string, cursor int64) *atomic.Int64 {
	var at atomic.Int64
	at.Store(cursor)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			conn, resp, err := websocket.DefaultDialer.DialContext(ctx, fmt.Sprintf("%s?cursor=%d", wsURL, at.Load()), http.Header{"User-Agent": {"looping-relay/1"}})
			if err != nil {
				continue
			}
			resp.Body.Close()
			conn.SetReadLimit(5_000_000)
			stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
			for {
				if _, _, err := conn.ReadMessage(); err != nil {
					break
				}
			}
			stop()
			_ = conn.Close()
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &at
}

// TestOneAlertPerStuckIncident: a relay stuck on an oversized event is
// seen by consumer health (its connections) and by the relay watch (its
// getHostStatus); the webhook gets one alert for the incident, naming the
// event and the repair command.
//
// Not parallel: it reads the alert counter from the process-wide metrics
// registry, which another serve would take over.
func TestOneAlertPerStuckIncident(t *testing.T) {
	var relaySeq atomic.Int64
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/xrpc/com.atproto.sync.getHostStatus" {
			return // requestCrawl
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": r.URL.Query().Get("hostname"), "seq": relaySeq.Load(), "status": "active"})
	}))
	t.Cleanup(relay.Close)
	hook := newAlertReceiver(t)
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := startLiveServer(t, serverOptions{extra: []string{
		"--crawlers", relay.URL, "--relay-watch-interval", "200ms", "--relay-stuck-for", "1s",
		"--alert-webhook", hook.URL, "--firehose-oversize-sync=false", "--metrics-listen", metricsAddr,
	}})
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "carol", "--email", "carol@example.com")
	token, status := s.login(t, acct.Handle, acct.Password)
	require.Equal(t, http.StatusOK, status)
	user := testUser{did: acct.DID, handle: acct.Handle}
	note := func(text string) int64 {
		s.createRecord(t, token, acct.DID, "com.example.note", map[string]any{"$type": "com.example.note", "text": text})
		return s.sequenced(t, []testUser{user})
	}
	bad := note("too big, once stored")
	relaySeq.Store(bad - 1)
	note("after it")

	// The event is stored over the relays' frame limit, as a bug or an
	// import could have stored it.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.databaseURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var body []byte
	require.NoError(t, conn.QueryRow(ctx, "SELECT body FROM events WHERE seq = $1", bad).Scan(&body))
	body, seqOffset, blocksLen := eventlogtest.InflateCommit(t, body, 5_100_000)
	_, err = conn.Exec(ctx, "UPDATE events SET body = $2, seq_offset = $3, blocks_len = $4 WHERE seq = $1", bad, body, seqOffset, blocksLen)
	require.NoError(t, err)
	loopRelay(t, "ws"+strings.TrimPrefix(s.url, "http")+"/xrpc/com.atproto.sync.subscribeRepos", bad-1)

	both := func() bool {
		l := s.logs.String()
		return strings.Contains(l, "firehose consumer is stuck") && strings.Contains(l, "relay is stuck on our firehose")
	}
	require.Eventually(t, both, waitLimit, 20*time.Millisecond, "consumer health and the relay watch both see it")
	counted := func() (sent, deduplicated string) {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		for line := range strings.Lines(string(raw)) {
			if v, ok := strings.CutPrefix(line, `bulwark_alerts_total{result="sent"} `); ok {
				sent = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, `bulwark_alerts_total{result="deduplicated"} `); ok {
				deduplicated = strings.TrimSpace(v)
			}
		}
		return sent, deduplicated
	}
	require.Eventually(t, func() bool {
		sent, dedup := counted()
		return sent == "1" && dedup == "1"
	}, waitLimit, 20*time.Millisecond, "one alert sent, the other detector's deduplicated")
	got := hook.alerts()
	require.Len(t, got, 1)
	a := got[0]
	require.Equal(t, alert.StuckIncident(bad), a.Incident)
	require.Equal(t, alert.SeverityCritical, a.Severity)
	for _, want := range []string{fmt.Sprintf("seq %d", bad), "#commit", "5100", fmt.Sprintf("bulwark admin firehose rewrite-as-sync --seq %d", bad)} {
		require.Contains(t, a.Summary, want)
	}
}
