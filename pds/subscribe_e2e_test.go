package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
)

// TestSubscribeEndToEnd runs indigo's consumer against the whole server:
// accounts created, written to concurrently over XRPC, renamed,
// deactivated and reactivated, deleted. Every event arrives once and in
// order, every #commit inverts against prevData and carries a signature
// that verifies against the key in the account's PLC document.
func TestSubscribeEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The sequencer runs inside newAccountEnv; the hub hears it over
	// NOTIFY, as a second process would.
	hub := firehose.NewHub(pool, firehose.Config{Logger: logger})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = hub.Run(ctx) })
	e := newAccountEnv(t, envOptions{pool: pool, sequence: true, options: func(o *Options) {
		o.Firehose = hub
	}})
	wsURL := "ws" + strings.TrimPrefix(e.url, "http") + "/xrpc/com.atproto.sync.subscribeRepos"

	dir := &identity.BaseDirectory{PLCURL: e.plcURL, HTTPClient: *http.DefaultClient, SkipHandleVerification: true}
	var mu sync.Mutex
	var seqs []int64
	var problems []string
	kinds := map[string]int{}
	note := func(seq int64, kind string, err error) {
		mu.Lock()
		defer mu.Unlock()
		seqs = append(seqs, seq)
		kinds[kind]++
		if err != nil {
			problems = append(problems, fmt.Sprintf("seq %d: %v", seq, err))
		}
	}
	cb := &events.RepoStreamCallbacks{
		RepoCommit: func(c *comatproto.SyncSubscribeRepos_Commit) error {
			note(c.Seq, "commit", verifyCommitWithPLC(ctx, dir, c))
			return nil
		},
		RepoSync:     func(s *comatproto.SyncSubscribeRepos_Sync) error { note(s.Seq, "sync", nil); return nil },
		RepoIdentity: func(s *comatproto.SyncSubscribeRepos_Identity) error { note(s.Seq, "identity", nil); return nil },
		RepoAccount:  func(s *comatproto.SyncSubscribeRepos_Account) error { note(s.Seq, "account", nil); return nil },
		Error: func(f *events.ErrorFrame) error {
			note(0, "error", fmt.Errorf("%s: %s", f.Error, f.Message))
			return nil
		},
	}
	conn, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
	require.NoError(t, err)
	wg.Go(func() {
		_ = events.HandleRepoStream(ctx, conn, sequential.NewScheduler("e2e", cb.EventHandler), logger)
	})
	require.Eventually(t, func() bool { return hub.Live() == 1 }, 10*time.Second, time.Millisecond)

	users := []*user{e.createUser(t), e.createUser(t), e.createUser(t)}
	var writers sync.WaitGroup
	for _, u := range users {
		writers.Go(func() {
			for i := range 8 {
				if err := createPost(e, u, fmt.Sprint("post ", i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	e.post(t, "com.atproto.identity.updateHandle", users[0].access, map[string]any{"handle": "renamed" + itoa(int(userSeq.Add(1))) + ".test"}).ok(t)
	e.post(t, "com.atproto.server.deactivateAccount", users[1].access, map[string]any{}).ok(t)
	e.post(t, "com.atproto.server.activateAccount", users[1].access, nil).ok(t)
	e.post(t, "com.atproto.repo.createRecord", users[1].access, map[string]any{
		"repo": users[1].did, "collection": "app.bsky.feed.post", "record": post("back")}).ok(t)
	e.deleteOwnAccount(t, users[2]).ok(t)

	var want []int64
	var readErr error
	require.Eventually(t, func() bool {
		var pending int
		want, pending, readErr = sequencedSeqs(ctx, pool)
		if readErr != nil {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		return pending == 0 && len(seqs) == len(want)
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, readErr)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems)
	require.Equal(t, want, seqs, "every event once, in order")
	require.Equal(t, 3*8+1, kinds["commit"])
	require.GreaterOrEqual(t, kinds["identity"], 3+1)
	require.GreaterOrEqual(t, kinds["account"], 3+2+1)
	require.GreaterOrEqual(t, kinds["sync"], 3)
}

// verifyCommitWithPLC checks a #commit's diff against prevData and its
// signature against the key the account's DID document publishes.
func verifyCommitWithPLC(ctx context.Context, dir identity.Directory, c *comatproto.SyncSubscribeRepos_Commit) error {
	if _, err := atrepo.VerifyCommitMessage(ctx, c); err != nil {
		return err
	}
	commit, _, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(c.Blocks))
	if err != nil {
		return err
	}
	ident, err := dir.LookupDID(ctx, syntax.DID(c.Repo))
	if err != nil {
		return err
	}
	pub, err := ident.PublicKey()
	if err != nil {
		return err
	}
	return commit.VerifySignature(pub)
}

// createPost writes a post as u, from a goroutine other than the test's
// (so it returns what went wrong instead of failing the test).
func createPost(e *accountEnv, u *user, text string) error {
	body, err := json.Marshal(map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post(text)})
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, e.url+"/xrpc/com.atproto.repo.createRecord", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+u.access)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("createRecord: %d %s", resp.StatusCode, b)
	}
	return nil
}

// sequencedSeqs returns the seqs of the log's valid events and how many
// events are not sequenced yet. Pending is read first: once nothing is,
// every event written before is numbered and in the log read next (read
// the other way round, the sequencer could number the last one in between).
func sequencedSeqs(ctx context.Context, pool *pgxpool.Pool) ([]int64, int, error) {
	var pending int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE seq IS NULL").Scan(&pending); err != nil {
		return nil, 0, err
	}
	rows, err := pool.Query(ctx, "SELECT seq FROM events WHERE seq IS NOT NULL AND NOT invalidated ORDER BY seq")
	if err != nil {
		return nil, 0, err
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	return seqs, pending, err
}
