package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// clusterSecrets are the settings every node of a test cluster shares.
type clusterSecrets struct {
	jwt, admin, rotation string
}

func newClusterSecrets(t *testing.T) clusterSecrets {
	t.Helper()
	rnd := func(n int) string {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	return clusterSecrets{jwt: rnd(32), admin: rnd(24), rotation: key.Multibase()}
}

func (c clusterSecrets) flags() []string {
	return []string{"--jwt-secret", c.jwt, "--admin-password", c.admin, "--plc-rotation-key", c.rotation}
}

// testCluster is what the nodes of a test cluster share: a database, a
// PLC, the secrets, a shared blob directory and the public host name.
type testCluster struct {
	dbURL         string
	plc           *httptest.Server
	sec           clusterSecrets
	blobDir, host string
}

func newTestCluster(t *testing.T) testCluster {
	t.Helper()
	_, plc := plctest.NewServer(t)
	return testCluster{dbURL: dbtest.NewURL(t), plc: plc, sec: newClusterSecrets(t), blobDir: t.TempDir(),
		host: "localhost:" + strconv.Itoa(freePort(t))}
}

// node is a node's options: the shared settings and extra.
func (c testCluster) node(extra ...string) serverOptions {
	return serverOptions{databaseURL: c.dbURL, hostname: c.host, plcURL: c.plc.URL,
		extra: append(append(c.sec.flags(), "--blob-dir", c.blobDir, "--blob-dir-shared"), extra...)}
}

// account creates an account named name through creator's admin CLI and
// signs it in on signIn; it returns the account and its access token.
func (c testCluster) account(t *testing.T, creator, signIn *liveServer, name string) (createdAccount, string) {
	t.Helper()
	code, out, errOut := cli("admin", "--url", creator.url, "--admin-password", c.sec.admin, "account", "create",
		"--handle", name+".test", "--email", name+"@example.com", "--json")
	require.Equal(t, 0, code, errOut)
	var acct createdAccount
	require.NoError(t, json.Unmarshal([]byte(out), &acct))
	token, status := signIn.login(t, acct.Handle, acct.Password)
	require.Equal(t, http.StatusOK, status)
	return acct, token
}

// refusedServe runs serve with args and requires it to stop at start with
// exit code 1; it returns the log.
func refusedServe(t *testing.T, args []string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "text"}, args...), &out, &errOut)
	require.Equal(t, 1, code, "serve started: %s", errOut.String())
	return strings.ReplaceAll(errOut.String(), `\n`, "\n")
}

var (
	clockIDLog    = regexp.MustCompile(`msg="joined the cluster" .*clock_id=(\d+)`)
	tookSequencer = regexp.MustCompile(`msg="took lease" .*lease=sequencer `)
)

// clockID is the TID clock id a server logged when it joined.
func (s *liveServer) clockID(t *testing.T) uint {
	t.Helper()
	m := clockIDLog.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m, "no clock id in the log")
	id, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return uint(id)
}

// TestTwoNodesOneDatabase runs two servers on one database, as a cluster
// behind a load balancer would: a node with another secret or a blob
// directory of its own is refused with what to set; a session from one
// node works on the other; record keys made without a key carry each
// node's clock id; a blob uploaded through one is served by the other;
// events committed through one reach the other's firehose; and when the
// sequencing node stops, the other takes over.
func TestTwoNodesOneDatabase(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t)
	dbURL, plc, sec, blobDir, host := tc.dbURL, tc.plc, tc.sec, tc.blobDir, tc.host
	node := tc.node
	a := startLiveServer(t, node())

	base := []string{"--database-url", dbURL, "--hostname", host, "--plc-url", plc.URL, "--data-dir", t.TempDir()}
	other := newClusterSecrets(t)
	log := refusedServe(t, append(base, "--jwt-secret", other.jwt, "--admin-password", sec.admin, "--plc-rotation-key", sec.rotation,
		"--blob-dir", blobDir, "--blob-dir-shared"))
	require.Contains(t, log, "the JWT secret (--jwt-secret, BULWARK_JWT_SECRET) differs from what node")
	require.NotContains(t, log, sec.jwt)
	require.NotContains(t, log, other.jwt)
	log = refusedServe(t, append(base, sec.flags()...))
	require.Contains(t, log, "the blob store (here: directory ")
	require.Contains(t, log, "--blob-dir-shared")
	log = refusedServe(t, append(base, "--jwt-secret", sec.jwt, "--admin-password", sec.admin, "--plc-rotation-key", other.rotation,
		"--blob-dir", blobDir, "--blob-dir-shared"))
	require.Contains(t, log, "the PLC rotation key (--plc-rotation-key, BULWARK_PLC_ROTATION_KEY)")

	b := startLiveServer(t, node())
	require.NotEqual(t, a.clockID(t), b.clockID(t))

	acct, token := tc.account(t, a, b, "alice")

	live := subscribe(t, b)
	for _, s := range []*liveServer{a, b, a, b} {
		s.createRecord(t, token, acct.DID, "app.bsky.feed.post", map[string]any{"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "2026-01-01T00:00:00Z"})
		tid, err := syntax.ParseTID(s.lastRKey)
		require.NoError(t, err)
		require.Equal(t, s.clockID(t), tid.ClockID(), "record key %s", s.lastRKey)
		rev := latestRev(t, s, acct.DID)
		live.waitCommit(t, acct.DID, rev)
	}

	data := make([]byte, 5000)
	_, _ = rand.Read(data)
	var up struct {
		Blob map[string]any `json:"blob"`
	}
	status, body := a.xrpc(t, http.MethodPost, "com.atproto.repo.uploadBlob", token, nil, data, &up)
	require.Equal(t, http.StatusOK, status, "%s", body)
	cid := up.Blob["ref"].(map[string]any)["$link"].(string)
	b.createRecord(t, token, acct.DID, "com.example.photo", map[string]any{"$type": "com.example.photo", "image": up.Blob})
	status, got := b.xrpc(t, http.MethodGet, "com.atproto.sync.getBlob", "", url.Values{"did": {acct.DID}, "cid": {cid}}, nil, nil)
	require.Equal(t, http.StatusOK, status, "%s", got)
	require.Equal(t, data, got)

	// The node that sequences stops; the other takes the lease at once
	// (it was released) and numbers what is written through it.
	leader, follower := a, b
	if tookSequencer.MatchString(b.logs.String()) {
		leader, follower = b, a
	}
	live.close()
	live = subscribe(t, follower)
	leader.stop(t)
	follower.createRecord(t, token, acct.DID, "app.bsky.feed.post", map[string]any{"$type": "app.bsky.feed.post", "text": "after", "createdAt": "2026-01-01T00:00:00Z"})
	live.waitCommit(t, acct.DID, latestRev(t, follower, acct.DID))
	require.Regexp(t, tookSequencer, follower.logs.String())
}

// latestRev is the rev of did's current commit, as s serves it.
func latestRev(t *testing.T, s *liveServer, did string) string {
	t.Helper()
	var head struct {
		Rev string `json:"rev"`
	}
	status, body := s.xrpc(t, http.MethodGet, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {did}}, nil, &head)
	require.Equal(t, http.StatusOK, status, "%s", body)
	return head.Rev
}

// liveStream is a subscribeRepos connection read on its own goroutine.
type liveStream struct {
	conn    *websocket.Conn
	commits chan *comatproto.SyncSubscribeRepos_Commit
}

// subscribe opens s's firehose live (no cursor).
func subscribe(t *testing.T, s *liveServer) *liveStream {
	t.Helper()
	ws := "ws" + strings.TrimPrefix(s.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"
	conn, resp, err := websocket.DefaultDialer.Dial(ws, nil)
	require.NoError(t, err)
	resp.Body.Close()
	l := &liveStream{conn: conn, commits: make(chan *comatproto.SyncSubscribeRepos_Commit, 100)}
	go func() {
		defer close(l.commits)
		for {
			_, raw, err := conn.ReadMessage()
			if err != nil {
				return
			}
			r := bytes.NewReader(raw)
			var hdr events.EventHeader
			if hdr.UnmarshalCBOR(r) != nil || hdr.MsgType != "#commit" {
				continue
			}
			var ev comatproto.SyncSubscribeRepos_Commit
			if ev.UnmarshalCBOR(r) == nil {
				l.commits <- &ev
			}
		}
	}()
	t.Cleanup(l.close)
	return l
}

func (l *liveStream) close() { _ = l.conn.Close() }

// waitCommit reads commits until did's commit at rev arrives.
func (l *liveStream) waitCommit(t *testing.T, did, rev string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case ev, ok := <-l.commits:
			require.True(t, ok, "the firehose closed before %s's commit %s", did, rev)
			if ev.Repo == did && ev.Rev == rev {
				return
			}
		case <-deadline:
			t.Fatalf("no commit %s of %s on the firehose", rev, did)
		}
	}
}

// TestServeBehindPgBouncer: with --database-url through PgBouncer in
// transaction mode, serve refuses to start unless a direct URL is set
// beside it, and says what to set; with one, accounts, writes and the
// firehose work.
func TestServeBehindPgBouncer(t *testing.T) {
	t.Parallel()
	direct := dbtest.NewURL(t)
	pooled := dbtest.PgBouncer(t, direct, false)
	log := refusedServe(t, []string{"--database-url", pooled, "--data-dir", t.TempDir()})
	require.Contains(t, log, "goes through a connection pooler in transaction mode")
	require.Contains(t, log, "--database-direct-url (BULWARK_DATABASE_DIRECT_URL)")

	s := startLiveServer(t, serverOptions{databaseURL: pooled, extra: []string{"--database-direct-url", direct}})
	require.Contains(t, s.logs.String(), "sessions use --database-direct-url")
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "alice.test", "--email", "alice@example.com")
	token, status := s.login(t, acct.Handle, acct.Password)
	require.Equal(t, http.StatusOK, status)
	live := subscribe(t, s)
	for range 3 {
		s.createRecord(t, token, acct.DID, "app.bsky.feed.post", map[string]any{"$type": "app.bsky.feed.post", "text": "via a pooler", "createdAt": "2026-01-01T00:00:00Z"})
		live.waitCommit(t, acct.DID, latestRev(t, s, acct.DID))
	}
}
