package repo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// TestCrashLeavesConsistentState kills (SIGKILL) a process in the middle of
// writing and checks that roots, nodes, records and events still agree:
// every commit is all there or not there at all.
func TestCrashLeavesConsistentState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a writer subprocess")
	}
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	b := &bundle{pool: pool, keys: &testKeys{keys: map[syntax.DID]*atcrypto.PrivateKeyK256{}}}
	b.engine = New(pool, b.keys, nil, Config{})
	b.seq = eventlog.NewSequencer(pool, eventlog.SequencerConfig{})
	b.log = eventlog.NewLog(pool)
	did := b.newRepo(t, 7)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriterProcess$", "-test.v")
	cmd.Env = append(os.Environ(),
		"BULWARK_CRASH_DB="+url,
		"BULWARK_CRASH_DID="+did.String(),
		"BULWARK_CRASH_KEY="+b.keys.keys[did].Multibase(),
	)
	require.NoError(t, cmd.Start())
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE kind = 'commit'").Scan(&n))
		if n >= 100 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	// A COMMIT the writer sent just before dying still completes on the
	// server; wait for its backends to go before looking.
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bulwark-crash-writer'").Scan(&n))
		if n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A fresh engine (empty cache) must load the tree whole and extend it.
	b.engine = New(pool, b.keys, nil, Config{})
	b.exportMatchesIndex(t, did)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("after the crash"))}, nil)
	require.NoError(t, err)
	evs := b.sequencedEvents(t)
	commits := b.verifyChain(t, evs)
	require.GreaterOrEqual(t, commits[did], 100)
	var records, ops int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM records").Scan(&records))
	require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(sum(ops_count), 0) FROM events WHERE kind = 'commit'").Scan(&ops))
	require.Equal(t, ops, records, "every stored record came with its commit event and vice versa")
}

// TestCrashWriterProcess is the subprocess body of
// TestCrashLeavesConsistentState; it does nothing when run directly.
func TestCrashWriterProcess(t *testing.T) {
	url := os.Getenv("BULWARK_CRASH_DB")
	if url == "" {
		t.Skip("subprocess of TestCrashLeavesConsistentState")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "bulwark-crash-writer"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	did := syntax.DID(os.Getenv("BULWARK_CRASH_DID"))
	key, err := atcrypto.ParsePrivateMultibase(os.Getenv("BULWARK_CRASH_KEY"))
	require.NoError(t, err)
	k256 := key.(*atcrypto.PrivateKeyK256)
	e := New(pool, &testKeys{keys: map[syntax.DID]*atcrypto.PrivateKeyK256{did: k256}}, nil, Config{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				writes := make([]Write, 1+i%5)
				for j := range writes {
					writes[j] = create("app.bsky.feed.post", "", post(fmt.Sprint(w, i, j)))
				}
				if _, err := e.Apply(ctx, did, writes, nil); err != nil {
					t.Log(err)
				}
			}
		}()
	}
	wg.Wait()
}
